-- question: Where did each capped rack's batch work go, and has it come back?
-- parameters: window_s UInt32 = 86400
-- answer: one row per rack and pool whose batch work moved, latest move first: the pool that took it, when it left and came back (null: still away), seconds away, and what the router said last
WITH (SELECT max(issued_at) FROM ${database}.commands) AS newest
SELECT
    rack_id,
    pool,
    argMaxIf(to_pool, issued_at, ratio > 0) AS to_pool,
    maxIf(issued_at, ratio > 0) AS moved_at,
    if(maxIf(issued_at, ratio = 0) > moved_at, maxIf(issued_at, ratio = 0), NULL) AS back_at,
    dateDiff('second', moved_at, coalesce(back_at, newest)) AS away_s,
    countIf(ratio > 0) AS moves,
    argMax(status, issued_at) AS last_status,
    argMax(reason, issued_at) AS last_reason
FROM (
    SELECT
        c.target_rack_id AS rack_id,
        c.target_pool AS pool,
        JSONExtractFloat(c.parameters, 'batch_move_ratio') AS ratio,
        JSONExtractString(c.parameters, 'to_pool') AS to_pool,
        c.issued_at AS issued_at,
        c.reason AS reason,
        if(r.status = '', 'no result yet', toString(r.status)) AS status
    FROM ${database}.commands AS c
    LEFT JOIN (
        SELECT command_id, status, completed_at FROM ${database}.command_results
        ORDER BY completed_at LIMIT 1 BY command_id
    ) AS r ON r.command_id = c.command_id
    WHERE c.action = 'move_batch' AND c.issued_at > newest - INTERVAL {window_s:UInt32} SECOND
    ORDER BY c.issued_at
    LIMIT 1 BY c.command_id
)
GROUP BY rack_id, pool
HAVING moves > 0
ORDER BY moved_at DESC, rack_id, pool
