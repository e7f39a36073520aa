-- question: Why was this device isolated? Its telemetry per minute, every change in its health verdict, every controller decision about it (refusals too), and every command that targeted it or its node with the executor's result, on one time axis.
-- parameters: device_uuid String
-- answer: one row per event, oldest first: kind (telemetry, verdict, decision, command, result), when, and what
WITH
    {device_uuid:String} AS device,
    (SELECT any(node_id) FROM ${database}.device_1m WHERE device_uuid = device) AS node
SELECT kind, at, what FROM (
    SELECT
        'telemetry' AS kind,
        toDateTime64(minute, 3, 'UTC') AS at,
        format('util {} max temp {} C power {} W limit {} W sbe {} dbe {} xids [{}] throttled {}/{}',
               toString(round(sum(util_sum) / greatest(sum(util_n), 1), 2)),
               toString(round(max(temp_max_celsius), 1)),
               toString(round(sum(power_sum_watts) / greatest(sum(power_n), 1))),
               toString(min(power_limit_min_watts)), toString(max(sbe_volatile_max)),
               toString(max(dbe_volatile_max)), arrayStringConcat(groupUniqArrayArray(xids), ','),
               toString(sum(throttled_samples)), toString(sum(samples))) AS what
    FROM ${database}.device_1m
    WHERE device_uuid = device
    GROUP BY minute
    UNION ALL
    SELECT
        'verdict',
        v.observed_at,
        format('{} (was {}) score {}: {}', v.status, v.previous_status, toString(v.score),
               v.evidence)
    FROM ${database}.verdicts AS v
    WHERE v.device_uuid = device AND v.status != v.previous_status
    UNION ALL
    SELECT
        'decision',
        d.decided_at,
        format('{} {} {} ({}): {}', d.controller, d.action, d.outcome, d.reason, d.message)
    FROM ${database}.decisions AS d
    WHERE d.target = device
    UNION ALL
    SELECT
        'command',
        issued_at,
        format('{} {} ({}) by {} reason {} expires {}', command_type, action,
               toString(command_id), issuer, reason, toString(expires_at))
    FROM ${database}.commands
    WHERE target_device_uuid = device OR (target_device_uuid IS NULL AND target_node_id = node)
    UNION ALL
    SELECT
        'result',
        r.completed_at,
        format('{} {} ({}): {}', r.executor, r.status, toString(r.command_id), r.detail)
    FROM ${database}.command_results AS r
    WHERE r.command_id IN (
        SELECT command_id FROM ${database}.commands
        WHERE target_device_uuid = device OR (target_device_uuid IS NULL AND target_node_id = node)
    )
)
ORDER BY at, indexOf(['telemetry', 'verdict', 'decision', 'command', 'result'], kind)
