-- question: Which devices (and which groups judged together) are not healthy right now, and on what evidence?
-- parameters: window_s UInt32 = 3600
-- answer: one row per device whose latest verdict (within window_s of the newest) is not healthy, worst first: status, score, since when, the signals over their thresholds, and the evidence; a node, rack or cohort whose devices deviate together is a row too (level, and what its devices share in attribution)
SELECT
    device_uuid,
    argMax(status, observed_at) AS status,
    argMax(score, observed_at) AS score,
    max(observed_at) AS latest,
    argMax(arrayFilter(s -> s.2 >= s.3 AND s.3 > 0, signals), observed_at) AS over,
    argMax(evidence, observed_at) AS evidence,
    any(node_id) AS node_id,
    any(pool) AS pool,
    argMax(level, observed_at) AS level,
    argMax(attribution, observed_at) AS attribution
FROM ${database}.verdicts
WHERE observed_at >= (SELECT max(observed_at) FROM ${database}.verdicts)
    - toIntervalSecond({window_s:UInt32})
GROUP BY device_uuid
HAVING status != 'healthy'
ORDER BY indexOf(['failed', 'dying', 'suspect'], status), score DESC, device_uuid
