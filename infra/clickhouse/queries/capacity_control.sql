-- question: Did the capacity controller keep its promise? Per pool and minute, the optional-work budget it set, its PID terms, and the pool's TPOT p95 against the SLO.
-- parameters: window_s UInt32 = 3600, tpot_p95_slo_s Float64 = 0.08
-- answer: one row per pool and minute with serving: the budget in force at the minute's end (its last decision; 0 and '' before any), the P, I and D terms and the reason behind it, and the requests-weighted and worst TPOT p95 over the SLO
WITH (SELECT max(minute) FROM ${database}.pool_1m) AS newest
SELECT
    p.pool AS pool,
    p.minute AS minute,
    round(d.applied, 4) AS budget_ratio,
    round(d.p_term, 4) AS p_term,
    round(d.i_term, 4) AS i_term,
    round(d.d_term, 4) AS d_term,
    d.reason AS reason,
    round(p.tpot_weighted_s / {tpot_p95_slo_s:Float64}, 3) AS tpot_p95_over_slo,
    round(p.tpot_worst_s / {tpot_p95_slo_s:Float64}, 3) AS tpot_p95_worst_over_slo,
    p.served AS requests
FROM
(
    SELECT pool, minute, minute + INTERVAL 1 MINUTE AS minute_end, sum(requests) AS served,
           sum(tpot_p95_weighted_sum_s) / greatest(served, 1) AS tpot_weighted_s,
           max(tpot_p95_max_s) AS tpot_worst_s
    FROM ${database}.pool_1m
    WHERE minute > newest - INTERVAL {window_s:UInt32} SECOND
    GROUP BY pool, minute
) AS p
ASOF LEFT JOIN
(
    SELECT assumeNotNull(pool) AS pool, toDateTime(decided_at, 'UTC') AS decided_at,
           ifNull(applied, 0) AS applied, ifNull(p_term, 0) AS p_term,
           ifNull(i_term, 0) AS i_term, ifNull(d_term, 0) AS d_term, reason
    FROM ${database}.decisions
    WHERE controller = 'capacity' AND pool IS NOT NULL
) AS d ON d.pool = p.pool AND d.decided_at <= p.minute_end
ORDER BY pool, minute
