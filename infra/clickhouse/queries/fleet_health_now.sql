-- question: Is the fleet healthy now? Per accelerator type, over the last window before the newest sample.
-- parameters: window_s UInt32 = 120, hot_celsius Float64 = 85
-- answer: one row per accelerator type: devices and nodes reporting, utilisation, and how many devices are hot, throttled, past a double-bit ECC fault or raising XIDs
WITH (SELECT max(observed_at) FROM ${database}.accelerator_telemetry) AS newest
SELECT
    accelerator_type,
    uniqExact(device_uuid) AS devices_reporting,
    uniqExact(node_id) AS nodes_reporting,
    round(avg(gpu_util_ratio), 3) AS util,
    round(max(gpu_temp_celsius), 1) AS max_temp_celsius,
    uniqExactIf(device_uuid, gpu_temp_celsius >= {hot_celsius:Float64}) AS devices_hot,
    uniqExactIf(device_uuid, ifNull(clock_throttle_reasons, 0) != 0) AS devices_throttled,
    uniqExactIf(device_uuid, ecc_dbe_volatile_total > 0) AS devices_with_dbe,
    uniqExactIf(device_uuid, xid_last IS NOT NULL) AS devices_with_xid
FROM ${database}.accelerator_telemetry
WHERE observed_at > newest - INTERVAL {window_s:UInt32} SECOND
GROUP BY accelerator_type
ORDER BY accelerator_type
