-- question: What did executors do with the commands they were sent, by type, action and reason?
-- parameters: window_s UInt32 = 86400
-- answer: one row per command type, action, reason and result status, most frequent first
WITH (SELECT max(issued_at) FROM ${database}.commands) AS newest
SELECT
    c.command_type,
    c.action,
    c.reason,
    if(r.status = '', 'no result yet', toString(r.status)) AS status,
    count() AS commands,
    uniqExact(c.command_id) AS distinct_commands
FROM ${database}.commands AS c
LEFT JOIN (
    SELECT command_id, status, completed_at FROM ${database}.command_results
    ORDER BY completed_at LIMIT 1 BY command_id
) AS r ON r.command_id = c.command_id
WHERE c.issued_at > newest - INTERVAL {window_s:UInt32} SECOND
GROUP BY c.command_type, c.action, c.reason, status
ORDER BY commands DESC, c.command_type, c.action
