-- question: Which nodes have stopped sending heartbeats, and since when?
-- parameters: timeout_s UInt32 = 10
-- answer: one row per node silent for at least timeout_s before the newest heartbeat, longest silence first
WITH (SELECT max(observed_at) FROM ${database}.node_health) AS newest
SELECT
    node_id,
    any(rack_id) AS rack_id,
    max(observed_at) AS last_heartbeat,
    dateDiff('second', max(observed_at), newest) AS silent_s,
    max(heartbeat_seq) AS last_seq
FROM ${database}.node_health
GROUP BY node_id
HAVING silent_s >= {timeout_s:UInt32}
ORDER BY silent_s DESC, node_id
