-- question: How long do commands take from triggering event to decision to result, per command type, executor and outcome?
-- parameters: window_s UInt32 = 86400
-- answer: one row per command type, executor and status: results; issue-to-arrival and issue-to-result latency (p50, p95, max) in seconds; for commands that name their triggering event, event-to-issue and event-to-result latency (p50, p95); for commands that carry their controller's decision, event-to-decision and decision-to-result latency (p50)
WITH (SELECT max(completed_at) FROM ${database}.command_results) AS newest
SELECT
    r.command_type,
    r.executor,
    r.status,
    count() AS results,
    round(quantile(0.5)(dateDiff('millisecond', c.issued_at, r.received_at)) / 1000, 3) AS arrival_p50_s,
    round(quantile(0.5)(dateDiff('millisecond', c.issued_at, r.completed_at)) / 1000, 3) AS result_p50_s,
    round(quantile(0.95)(dateDiff('millisecond', c.issued_at, r.completed_at)) / 1000, 3) AS result_p95_s,
    round(max(dateDiff('millisecond', c.issued_at, r.completed_at)) / 1000, 3) AS result_max_s,
    countIf(c.cause_observed_at IS NOT NULL) AS with_cause,
    round(quantileIf(0.5)(dateDiff('millisecond', c.cause_observed_at, c.issued_at),
                          c.cause_observed_at IS NOT NULL) / 1000, 3) AS event_to_issue_p50_s,
    round(quantileIf(0.5)(dateDiff('millisecond', c.cause_observed_at, r.completed_at),
                          c.cause_observed_at IS NOT NULL) / 1000, 3) AS event_to_result_p50_s,
    round(quantileIf(0.95)(dateDiff('millisecond', c.cause_observed_at, r.completed_at),
                           c.cause_observed_at IS NOT NULL) / 1000, 3) AS event_to_result_p95_s,
    countIf(d.decided_at > toDateTime64(0, 3)) AS with_decision,
    round(quantileIf(0.5)(dateDiff('millisecond', c.cause_observed_at, d.decided_at),
                          c.cause_observed_at IS NOT NULL AND d.decided_at > toDateTime64(0, 3)) / 1000, 3) AS event_to_decision_p50_s,
    round(quantileIf(0.5)(dateDiff('millisecond', d.decided_at, r.completed_at),
                          d.decided_at > toDateTime64(0, 3)) / 1000, 3) AS decision_to_result_p50_s
FROM ${database}.command_results AS r
INNER JOIN (
    SELECT command_id, min(issued_at) AS issued_at, any(cause_observed_at) AS cause_observed_at,
           any(decision_id) AS decision_id
    FROM ${database}.commands GROUP BY command_id
) AS c ON c.command_id = r.command_id
-- a command without a decision finds none: chDB's LEFT JOIN miss reads the epoch
LEFT JOIN (
    SELECT decision_id, min(decided_at) AS decided_at FROM ${database}.decisions GROUP BY decision_id
) AS d ON d.decision_id = c.decision_id
WHERE r.completed_at > newest - INTERVAL {window_s:UInt32} SECOND
GROUP BY r.command_type, r.executor, r.status
ORDER BY r.command_type, r.executor, r.status
