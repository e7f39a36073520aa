-- question: What did the controllers decide, and why? Decisions by controller, outcome and reason, with an example.
-- parameters: window_s UInt32 = 86400
-- answer: within window_s of the newest decision, one row per (controller, outcome, reason, action): how many, over how many targets, first and last, and one message
SELECT
    controller,
    outcome,
    reason,
    action,
    count() AS decisions,
    uniqExact(target) AS targets,
    min(decided_at) AS first,
    max(decided_at) AS last,
    any(message) AS example
FROM ${database}.decisions
WHERE decided_at >= (SELECT max(decided_at) FROM ${database}.decisions)
    - toIntervalSecond({window_s:UInt32})
GROUP BY controller, outcome, reason, action
ORDER BY controller, outcome, decisions DESC
