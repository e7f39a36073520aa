-- question: Which replicas did power-aware routing weight down while their devices were capped, and are they back?
-- parameters: window_s UInt32 = 86400
-- answer: one row per pool and device the power_routing controller weighted, latest change first: its rack, the lowest weight it was given and its weight now (1: back), when it was first weighted and last changed, how many changes, and the last reason and message
WITH (SELECT max(decided_at) FROM ${database}.decisions) AS newest
SELECT
    pool,
    target AS device_uuid,
    any(rack_id) AS rack_id,
    min(applied) AS lowest_weight,
    argMax(applied, decided_at) AS weight_now,
    min(decided_at) AS first,
    max(decided_at) AS last,
    count() AS changes,
    argMax(reason, decided_at) AS last_reason,
    argMax(message, decided_at) AS last_message
FROM ${database}.decisions
WHERE controller = 'power_routing' AND decided_at > newest - INTERVAL {window_s:UInt32} SECOND
GROUP BY pool, device_uuid
ORDER BY last DESC, pool, device_uuid
