-- question: Did each pool meet its latency SLO? Share of requests served in intervals whose p95 TPOT and TTFT were within the SLO.
-- parameters: window_s UInt32 = 3600, tpot_p95_slo_s Float64 = 0.1, ttft_p95_slo_s Float64 = 2
-- answer: one row per pool and model: requests, share within the TPOT SLO, within the TTFT SLO, within both, and the error ratio
WITH (SELECT max(observed_at) FROM ${database}.serving_metrics) AS newest
SELECT
    pool,
    model,
    sum(requests) AS requests,
    round(sumIf(s.requests, s.tpot_p95_s <= {tpot_p95_slo_s:Float64}) / greatest(sum(s.requests), 1), 4) AS tpot_within_slo_ratio,
    round(sumIf(s.requests, s.ttft_p95_s <= {ttft_p95_slo_s:Float64}) / greatest(sum(s.requests), 1), 4) AS ttft_within_slo_ratio,
    round(sumIf(s.requests, s.tpot_p95_s <= {tpot_p95_slo_s:Float64} AND s.ttft_p95_s <= {ttft_p95_slo_s:Float64}) / greatest(sum(s.requests), 1), 4) AS within_slo_ratio,
    round(sum(s.errors) / greatest(sum(s.requests), 1), 4) AS error_ratio
FROM ${database}.serving_metrics AS s  -- qualified names: the aliases shadow columns
WHERE observed_at > newest - INTERVAL {window_s:UInt32} SECOND
GROUP BY pool, model
ORDER BY within_slo_ratio, pool, model
