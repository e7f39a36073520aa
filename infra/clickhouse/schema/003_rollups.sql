-- Per-minute rollups, kept by materialized views on every insert into the raw
-- tables: per device (accelerator telemetry), per pool and model (serving), per
-- rack and PDU (power), per model and region (demand). Dashboards and SRE
-- queries read these instead of scanning raw samples.
--
-- Averages are stored as sum and count (read avg = sum / count); rows of one
-- minute may sit in several parts until merged, so always GROUP BY the key.
-- A batch retried with the same insert_deduplication_token is deduplicated in
-- these views too (the sink sets deduplicate_blocks_in_dependent_materialized_views).
-- TTLs count from the last ingestion into a row, like the raw tables, so a
-- replayed historical trace keeps its rollups.

CREATE TABLE IF NOT EXISTS ${database}.device_1m
(
    minute DateTime('UTC'),
    device_uuid String,
    node_id SimpleAggregateFunction(any, String),
    rack_id SimpleAggregateFunction(any, String),
    region SimpleAggregateFunction(any, String),
    accelerator_type SimpleAggregateFunction(any, String),
    samples SimpleAggregateFunction(sum, UInt64),
    util_sum SimpleAggregateFunction(sum, Float64),
    util_n SimpleAggregateFunction(sum, UInt64),
    temp_max_celsius SimpleAggregateFunction(max, Nullable(Float32)),
    power_sum_watts SimpleAggregateFunction(sum, Float64),
    power_n SimpleAggregateFunction(sum, UInt64),
    power_max_watts SimpleAggregateFunction(max, Nullable(Float32)),
    power_limit_min_watts SimpleAggregateFunction(min, Nullable(Float32)),
    sbe_volatile_max SimpleAggregateFunction(max, Nullable(UInt64)),
    dbe_volatile_max SimpleAggregateFunction(max, Nullable(UInt64)),
    xids SimpleAggregateFunction(groupUniqArrayArray, Array(UInt64)),
    throttled_samples SimpleAggregateFunction(sum, UInt64),
    last_ingested_at SimpleAggregateFunction(max, DateTime64(3, 'UTC'))
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (device_uuid, minute)
TTL toDateTime(last_ingested_at) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS ${database}.device_1m_mv TO ${database}.device_1m AS
SELECT
    toStartOfMinute(observed_at) AS minute,
    device_uuid,
    any(node_id) AS node_id,
    any(toString(rack_id)) AS rack_id,
    any(toString(region)) AS region,
    any(toString(accelerator_type)) AS accelerator_type,
    count() AS samples,
    sum(ifNull(gpu_util_ratio, 0)) AS util_sum,
    count(gpu_util_ratio) AS util_n,
    max(gpu_temp_celsius) AS temp_max_celsius,
    sum(ifNull(power_usage_watts, 0)) AS power_sum_watts,
    count(power_usage_watts) AS power_n,
    max(power_usage_watts) AS power_max_watts,
    min(power_limit_watts) AS power_limit_min_watts,
    max(ecc_sbe_volatile_total) AS sbe_volatile_max,
    max(ecc_dbe_volatile_total) AS dbe_volatile_max,
    groupUniqArray(xid_last) AS xids,
    countIf(ifNull(clock_throttle_reasons, 0) != 0) AS throttled_samples,
    max(ingested_at) AS last_ingested_at
FROM ${database}.accelerator_telemetry
GROUP BY minute, device_uuid;

CREATE TABLE IF NOT EXISTS ${database}.pool_1m
(
    minute DateTime('UTC'),
    pool String,
    model String,
    region SimpleAggregateFunction(any, String),
    accelerator_type SimpleAggregateFunction(any, String),
    samples SimpleAggregateFunction(sum, UInt64),
    requests SimpleAggregateFunction(sum, UInt64),
    errors SimpleAggregateFunction(sum, UInt64),
    tokens SimpleAggregateFunction(sum, Float64),
    tpot_p95_weighted_sum_s SimpleAggregateFunction(sum, Float64),
    tpot_p95_max_s SimpleAggregateFunction(max, Nullable(Float64)),
    ttft_p95_weighted_sum_s SimpleAggregateFunction(sum, Float64),
    ttft_p95_max_s SimpleAggregateFunction(max, Nullable(Float64)),
    queue_depth_max SimpleAggregateFunction(max, UInt64),
    replicas AggregateFunction(uniqExact, String),
    last_ingested_at SimpleAggregateFunction(max, DateTime64(3, 'UTC'))
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (pool, model, minute)
TTL toDateTime(last_ingested_at) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS ${database}.pool_1m_mv TO ${database}.pool_1m AS
SELECT
    toStartOfMinute(observed_at) AS minute,
    pool,
    model,
    any(toString(region)) AS region,
    any(toString(accelerator_type)) AS accelerator_type,
    count() AS samples,
    sum(s.requests) AS requests,
    sum(s.errors) AS errors,
    sum(s.tokens_per_s * s.interval_s) AS tokens,
    sum(ifNull(s.tpot_p95_s, 0) * s.requests) AS tpot_p95_weighted_sum_s,
    max(tpot_p95_s) AS tpot_p95_max_s,
    sum(ifNull(s.ttft_p95_s, 0) * s.requests) AS ttft_p95_weighted_sum_s,
    max(ttft_p95_s) AS ttft_p95_max_s,
    max(queue_depth) AS queue_depth_max,
    uniqExactState(replica_id) AS replicas,
    max(ingested_at) AS last_ingested_at
FROM ${database}.serving_metrics AS s  -- qualified names: the aliases above shadow columns
GROUP BY minute, pool, model;

CREATE TABLE IF NOT EXISTS ${database}.rack_1m
(
    minute DateTime('UTC'),
    rack_id String,
    pdu_id String,
    region SimpleAggregateFunction(any, String),
    samples SimpleAggregateFunction(sum, UInt64),
    power_sum_watts SimpleAggregateFunction(sum, Float64),
    power_max_watts SimpleAggregateFunction(max, Float64),
    breaker_limit_min_watts SimpleAggregateFunction(min, Float64),
    capacity_watts SimpleAggregateFunction(max, Float64),
    over_limit_samples SimpleAggregateFunction(sum, UInt64),
    last_ingested_at SimpleAggregateFunction(max, DateTime64(3, 'UTC'))
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (rack_id, pdu_id, minute)
TTL toDateTime(last_ingested_at) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS ${database}.rack_1m_mv TO ${database}.rack_1m AS
SELECT
    toStartOfMinute(observed_at) AS minute,
    toString(p.rack_id) AS rack_id,
    p.pdu_id AS pdu_id,
    any(toString(region)) AS region,
    count() AS samples,
    sum(p.power_watts) AS power_sum_watts,
    max(p.power_watts) AS power_max_watts,
    min(breaker_limit_watts) AS breaker_limit_min_watts,
    max(capacity_watts) AS capacity_watts,
    countIf(p.power_watts > p.breaker_limit_watts) AS over_limit_samples,
    max(ingested_at) AS last_ingested_at
FROM ${database}.pdu_readings AS p
GROUP BY minute, rack_id, pdu_id;

CREATE TABLE IF NOT EXISTS ${database}.demand_1m
(
    minute DateTime('UTC'),
    model String,
    region String,
    requests SimpleAggregateFunction(sum, UInt64),
    prompt_tokens SimpleAggregateFunction(sum, UInt64),
    generated_tokens SimpleAggregateFunction(sum, UInt64),
    last_ingested_at SimpleAggregateFunction(max, DateTime64(3, 'UTC'))
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (model, region, minute)
TTL toDateTime(last_ingested_at) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS ${database}.demand_1m_mv TO ${database}.demand_1m AS
SELECT
    toStartOfMinute(observed_at) AS minute,
    model,
    toString(d.region) AS region,
    sum(d.requests) AS requests,
    sum(d.prompt_tokens) AS prompt_tokens,
    sum(d.generated_tokens) AS generated_tokens,
    max(ingested_at) AS last_ingested_at
FROM ${database}.demand AS d
GROUP BY minute, model, region;
