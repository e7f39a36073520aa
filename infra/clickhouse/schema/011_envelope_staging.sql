-- Node-tick envelopes (telemetry contract v2) land through these staging tables: the sink
-- inserts each validated envelope as one JSON line (its Kafka coordinates beside it), and
-- a materialized view writes one row per sample into the raw table, with sample_index.
-- The line is positional (JSONCompactEachRow): the columns in this table's order, each
-- sample an array in the order of its tuple below, which is its struct's field order
-- (schemas/envelopes.py); a test reads every field back from its column.
-- ClickHouse explodes the envelope; Python never writes a line per sample. The staging
-- tables keep nothing (Null engine); a retried insert with the same deduplication token
-- adds nothing downstream (deduplicate_blocks_in_dependent_materialized_views).

CREATE TABLE IF NOT EXISTS ${database}.accelerator_ticks_in
(
    event_id UUID,
    observed_at DateTime64(3, 'UTC'),
    node_id String,
    region LowCardinality(String),
    pod_id LowCardinality(String),
    rack_id LowCardinality(String),
    pdu_id LowCardinality(String),
    schema_version UInt8,
    samples Array(Tuple(
        device_uuid String,
        device_index UInt16,
        accelerator_type LowCardinality(String),
        gpu_temp_celsius Nullable(Float32),
        memory_temp_celsius Nullable(Float32),
        power_usage_watts Nullable(Float32),
        power_limit_watts Nullable(Float32),
        power_limit_min_watts Nullable(Float32),
        power_limit_max_watts Nullable(Float32),
        sm_clock_mhz Nullable(Float32),
        mem_clock_mhz Nullable(Float32),
        gpu_util_ratio Nullable(Float32),
        mem_copy_util_ratio Nullable(Float32),
        fb_used_bytes Nullable(UInt64),
        fb_total_bytes Nullable(UInt64),
        ecc_sbe_volatile_total Nullable(UInt64),
        ecc_dbe_volatile_total Nullable(UInt64),
        ecc_sbe_aggregate_total Nullable(UInt64),
        ecc_dbe_aggregate_total Nullable(UInt64),
        retired_pages_total Nullable(UInt64),
        remapped_rows_total Nullable(UInt64),
        xid_last Nullable(UInt64),
        pcie_replay_total Nullable(UInt64),
        nvlink_errors_total Nullable(UInt64),
        clock_throttle_reasons Nullable(UInt64)
    )),
    src_topic LowCardinality(String),
    src_partition UInt32,
    src_offset UInt64,
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = Null;

CREATE MATERIALIZED VIEW IF NOT EXISTS ${database}.accelerator_ticks_in_rows TO ${database}.accelerator_telemetry AS
SELECT
    schema_version,
    event_id,
    observed_at,
    node_id,
    sample.device_uuid AS device_uuid,
    sample.device_index AS device_index,
    sample.accelerator_type AS accelerator_type,
    region,
    pod_id,
    rack_id,
    pdu_id,
    sample.gpu_temp_celsius AS gpu_temp_celsius,
    sample.memory_temp_celsius AS memory_temp_celsius,
    sample.power_usage_watts AS power_usage_watts,
    sample.power_limit_watts AS power_limit_watts,
    sample.power_limit_min_watts AS power_limit_min_watts,
    sample.power_limit_max_watts AS power_limit_max_watts,
    sample.sm_clock_mhz AS sm_clock_mhz,
    sample.mem_clock_mhz AS mem_clock_mhz,
    sample.gpu_util_ratio AS gpu_util_ratio,
    sample.mem_copy_util_ratio AS mem_copy_util_ratio,
    sample.fb_used_bytes AS fb_used_bytes,
    sample.fb_total_bytes AS fb_total_bytes,
    sample.ecc_sbe_volatile_total AS ecc_sbe_volatile_total,
    sample.ecc_dbe_volatile_total AS ecc_dbe_volatile_total,
    sample.ecc_sbe_aggregate_total AS ecc_sbe_aggregate_total,
    sample.ecc_dbe_aggregate_total AS ecc_dbe_aggregate_total,
    sample.retired_pages_total AS retired_pages_total,
    sample.remapped_rows_total AS remapped_rows_total,
    sample.xid_last AS xid_last,
    sample.pcie_replay_total AS pcie_replay_total,
    sample.nvlink_errors_total AS nvlink_errors_total,
    sample.clock_throttle_reasons AS clock_throttle_reasons,
    src_topic,
    src_partition,
    src_offset,
    toUInt16(position - 1) AS sample_index,
    ingested_at
FROM ${database}.accelerator_ticks_in
ARRAY JOIN samples AS sample, arrayEnumerate(samples) AS position;

CREATE TABLE IF NOT EXISTS ${database}.serving_ticks_in
(
    event_id UUID,
    observed_at DateTime64(3, 'UTC'),
    node_id String,
    region LowCardinality(String),
    schema_version UInt8,
    samples Array(Tuple(
        replica_id String,
        model LowCardinality(String),
        pool LowCardinality(String),
        accelerator_type LowCardinality(String),
        interval_s Float64,
        queue_depth UInt64,
        batch_size UInt64,
        tokens_per_s Float64,
        requests UInt64,
        errors UInt64,
        device_uuid Nullable(String),
        tpot_p50_s Nullable(Float64),
        tpot_p95_s Nullable(Float64),
        ttft_p50_s Nullable(Float64),
        ttft_p95_s Nullable(Float64),
        kv_cache_util_ratio Nullable(Float32),
        optional_requests Nullable(UInt64),
        batch_requests Nullable(UInt64)
    )),
    src_topic LowCardinality(String),
    src_partition UInt32,
    src_offset UInt64,
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = Null;

CREATE MATERIALIZED VIEW IF NOT EXISTS ${database}.serving_ticks_in_rows TO ${database}.serving_metrics AS
SELECT
    schema_version,
    event_id,
    observed_at,
    sample.replica_id AS replica_id,
    node_id,
    sample.device_uuid AS device_uuid,
    sample.model AS model,
    sample.pool AS pool,
    region,
    sample.accelerator_type AS accelerator_type,
    sample.interval_s AS interval_s,
    sample.tpot_p50_s AS tpot_p50_s,
    sample.tpot_p95_s AS tpot_p95_s,
    sample.ttft_p50_s AS ttft_p50_s,
    sample.ttft_p95_s AS ttft_p95_s,
    sample.queue_depth AS queue_depth,
    sample.batch_size AS batch_size,
    sample.kv_cache_util_ratio AS kv_cache_util_ratio,
    sample.tokens_per_s AS tokens_per_s,
    sample.requests AS requests,
    sample.errors AS errors,
    sample.optional_requests AS optional_requests,
    sample.batch_requests AS batch_requests,
    src_topic,
    src_partition,
    src_offset,
    toUInt16(position - 1) AS sample_index,
    ingested_at
FROM ${database}.serving_ticks_in
ARRAY JOIN samples AS sample, arrayEnumerate(samples) AS position;

