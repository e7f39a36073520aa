-- question: Where was a model requested while no replica of it served in that region (a cold start), for how long, and when was it warmed?
-- parameters: window_s UInt32 = 86400
-- answer: one row per model and region that went cold: intervals and seconds with demand but no serving replica, requests in them, the first and last such instant, and the first warm command for the model with its result
WITH (SELECT max(observed_at) FROM ${database}.demand) AS newest
SELECT
    d.model AS model,
    d.region AS region,
    count() AS cold_intervals,
    sum(d.interval_s) AS cold_seconds,
    sum(d.requests) AS requests_while_cold,
    min(d.observed_at) AS first_cold_at,
    max(d.observed_at) AS last_cold_at,
    nullIf(any(w.issued_at), toDateTime64(0, 3, 'UTC')) AS warm_issued_at,
    nullIf(toString(any(w.status)), '') AS warm_result
FROM (
    SELECT observed_at, model, toString(region) AS region, sum(requests) AS requests,
           any(interval_s) AS interval_s
    FROM ${database}.demand
    WHERE observed_at > newest - INTERVAL {window_s:UInt32} SECOND
    GROUP BY observed_at, model, region
    HAVING requests > 0
) AS d
LEFT JOIN (
    SELECT observed_at, model, toString(region) AS region, uniqExact(replica_id) AS replicas
    FROM ${database}.serving_metrics
    WHERE observed_at > newest - INTERVAL {window_s:UInt32} SECOND
    GROUP BY observed_at, model, region
) AS s ON s.observed_at = d.observed_at AND s.model = d.model AND s.region = d.region
LEFT JOIN (
    SELECT JSONExtractString(c.parameters, 'model') AS model, min(c.issued_at) AS issued_at,
           argMin(r.status, c.issued_at) AS status
    FROM ${database}.commands AS c
    LEFT JOIN ${database}.command_results AS r ON r.command_id = c.command_id
    WHERE c.command_type = 'WarmCommand' AND c.action = 'warm'
    GROUP BY model
) AS w ON w.model = d.model
WHERE s.replicas = 0
GROUP BY d.model, d.region
ORDER BY requests_while_cold DESC, model, region
