-- Telemetry tables, one per event family. Applied by the project at start-up
-- (idempotent). ${database} is substituted by the store.
-- Every row carries the Kafka coordinates it came from (src_*, or source_* for
-- dead letters): the sink uses them as per-partition watermarks so a replay
-- after a crash adds no rows. That needs each insert to be all-or-nothing:
-- tables are partitioned by ingestion time, which is one instant per batch,
-- so a batch (at most 100k rows) is one block and lands as one part. A
-- partition key on event time could split a batch that straddles midnight
-- into two parts, and a crash between them would leave a gap the watermark
-- hides. Queries on event time use the ordering key.
-- TTLs count from ingestion too, so replayed historical traces are not dropped.

CREATE TABLE IF NOT EXISTS ${database}.accelerator_telemetry
(
    schema_version UInt8,
    event_id UUID,
    observed_at DateTime64(3, 'UTC'),
    node_id String,
    device_uuid String,
    device_index UInt16,
    accelerator_type LowCardinality(String),
    region LowCardinality(String),
    pod_id LowCardinality(String),
    rack_id LowCardinality(String),
    pdu_id LowCardinality(String),
    gpu_temp_celsius Nullable(Float32),
    memory_temp_celsius Nullable(Float32),
    power_usage_watts Nullable(Float32),
    power_limit_watts Nullable(Float32),
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
    clock_throttle_reasons Nullable(UInt64),
    src_topic LowCardinality(String),
    src_partition UInt32,
    src_offset UInt64,
    sample_index UInt16 DEFAULT 0,
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ingested_at)
ORDER BY (node_id, device_uuid, observed_at)
TTL toDateTime(ingested_at) + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS ${database}.node_health
(
    schema_version UInt8,
    event_id UUID,
    observed_at DateTime64(3, 'UTC'),
    node_id String,
    region LowCardinality(String),
    pod_id LowCardinality(String),
    rack_id LowCardinality(String),
    agent_version LowCardinality(String),
    heartbeat_seq UInt64,
    uptime_s Float64,
    probes Array(Tuple(
        probe LowCardinality(String),
        device_uuid Nullable(String),
        passed Bool,
        duration_s Float64,
        achieved_per_s Nullable(Float64),
        expected_ratio Nullable(Float64))),
    src_topic LowCardinality(String),
    src_partition UInt32,
    src_offset UInt64,
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ingested_at)
ORDER BY (node_id, observed_at)
TTL toDateTime(ingested_at) + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS ${database}.pdu_readings
(
    schema_version UInt8,
    event_id UUID,
    observed_at DateTime64(3, 'UTC'),
    pdu_id LowCardinality(String),
    rack_id LowCardinality(String),
    pod_id LowCardinality(String),
    region LowCardinality(String),
    phase LowCardinality(String),
    power_watts Float64,
    capacity_watts Float64,
    breaker_limit_watts Float64,
    voltage_volts Nullable(Float64),
    current_amperes Nullable(Float64),
    src_topic LowCardinality(String),
    src_partition UInt32,
    src_offset UInt64,
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ingested_at)
ORDER BY (rack_id, pdu_id, observed_at)
TTL toDateTime(ingested_at) + INTERVAL 90 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS ${database}.serving_metrics
(
    schema_version UInt8,
    event_id UUID,
    observed_at DateTime64(3, 'UTC'),
    replica_id String,
    node_id String,
    model LowCardinality(String),
    pool LowCardinality(String),
    region LowCardinality(String),
    accelerator_type LowCardinality(String),
    interval_s Float64,
    tpot_p50_s Nullable(Float64),
    tpot_p95_s Nullable(Float64),
    ttft_p50_s Nullable(Float64),
    ttft_p95_s Nullable(Float64),
    queue_depth UInt64,
    batch_size UInt64,
    kv_cache_util_ratio Nullable(Float32),
    tokens_per_s Float64,
    requests UInt64,
    errors UInt64,
    src_topic LowCardinality(String),
    src_partition UInt32,
    src_offset UInt64,
    sample_index UInt16 DEFAULT 0,
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ingested_at)
ORDER BY (pool, model, replica_id, observed_at)
TTL toDateTime(ingested_at) + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS ${database}.demand
(
    schema_version UInt8,
    event_id UUID,
    observed_at DateTime64(3, 'UTC'),
    model LowCardinality(String),
    region LowCardinality(String),
    interval_s Float64,
    requests UInt64,
    prompt_tokens UInt64,
    generated_tokens UInt64,
    src_topic LowCardinality(String),
    src_partition UInt32,
    src_offset UInt64,
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(ingested_at)
ORDER BY (model, region, observed_at)
TTL toDateTime(ingested_at) + INTERVAL 180 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS ${database}.dead_letters
(
    received_at DateTime64(3, 'UTC'),
    source_topic LowCardinality(String),
    source_partition UInt32,
    source_offset UInt64,
    source_index Nullable(UInt32),
    source_key Nullable(String),
    error_kind LowCardinality(String),
    error String,
    raw String,
    raw_size_bytes UInt64,
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(ingested_at)
ORDER BY (source_topic, error_kind, received_at)
TTL toDateTime(ingested_at) + INTERVAL 90 DAY
SETTINGS non_replicated_deduplication_window = 10000;
