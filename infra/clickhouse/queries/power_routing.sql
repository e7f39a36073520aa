-- question: Which replicas, and which pools for a model, did power-aware routing weight down while their devices were capped, and are they back?
-- parameters: window_s UInt32 = 86400
-- answer: one row per weight the power_routing controller moved, latest change first: a replica's (device_uuid and its rack) within its pool, or a pool's for one model (model; every replica of the model there was capped, so its share went to the region's other pools); the lowest weight it was given and its weight now (1: back), when it was first weighted and last changed, how many changes, and the last reason and message
WITH (SELECT max(decided_at) FROM ${database}.decisions) AS newest
SELECT
    pool,
    if(whole_pool, NULL, target) AS device_uuid,
    if(whole_pool, target, NULL) AS model,
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
GROUP BY pool, target, startsWith(reason, 'pool_') AS whole_pool
ORDER BY last DESC, pool, target
