-- question: What input was refused, where from, and why?
-- parameters: window_s UInt32 = 86400
-- answer: one row per source topic and error kind: count, first and last seen, and one example with its coordinates
WITH (SELECT max(received_at) FROM ${database}.dead_letters) AS newest
SELECT
    source_topic,
    error_kind,
    count() AS dead_letters,
    min(received_at) AS first_seen,
    max(received_at) AS last_seen,
    any(format('partition {} offset {}', toString(source_partition), toString(source_offset))) AS example_at,
    substring(any(error), 1, 200) AS example_error
FROM ${database}.dead_letters
WHERE received_at > newest - INTERVAL {window_s:UInt32} SECOND
GROUP BY source_topic, error_kind
ORDER BY dead_letters DESC, source_topic, error_kind
