-- question: How much power headroom does each rack have under its breaker limit, now and at worst over the window?
-- parameters: window_s UInt32 = 900
-- answer: one row per rack and PDU, least headroom now first; headroom is breaker limit minus draw
WITH (SELECT max(observed_at) FROM ${database}.pdu_readings) AS newest
SELECT
    rack_id,
    pdu_id,
    round(argMax(power_watts, observed_at)) AS power_now_watts,
    round(argMax(breaker_limit_watts, observed_at)) AS limit_now_watts,
    round(argMax(breaker_limit_watts - power_watts, observed_at)) AS headroom_now_watts,
    round(argMax((breaker_limit_watts - power_watts) / breaker_limit_watts, observed_at), 3) AS headroom_now_ratio,
    round(min(breaker_limit_watts - power_watts)) AS headroom_min_watts,
    countIf(power_watts > breaker_limit_watts) AS readings_over_limit,
    round(max(power_watts)) AS power_max_watts
FROM ${database}.pdu_readings
WHERE observed_at > newest - INTERVAL {window_s:UInt32} SECOND
GROUP BY rack_id, pdu_id
ORDER BY headroom_now_watts, rack_id
