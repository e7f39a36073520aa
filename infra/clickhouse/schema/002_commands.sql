-- Commands as they appeared on the command topics (forged and expired ones
-- too: this is the audit of what executors were asked), and the result every
-- executor published for each. Same conventions as 001: Kafka coordinates per
-- row for idempotent replays, partitions and TTLs by ingestion time.
-- Type-specific fields (weight, power limit, model, replicas...) are kept as
-- JSON in `parameters`; `target_*` flatten the command's target.

CREATE TABLE IF NOT EXISTS ${database}.commands
(
    schema_version UInt8,
    command_id UUID,
    command_type LowCardinality(String),
    action LowCardinality(String),
    issued_at DateTime64(3, 'UTC'),
    expires_at DateTime64(3, 'UTC'),
    issuer LowCardinality(String),
    target_node_id Nullable(String),
    target_device_uuid Nullable(String),
    target_pool Nullable(String),
    target_rack_id Nullable(String),
    target_region Nullable(String),
    reason LowCardinality(String),
    message String,
    cause_event_id Nullable(UUID),
    cause_observed_at Nullable(DateTime64(3, 'UTC')),
    decision_id Nullable(UUID),
    key_id Nullable(String),
    signature Nullable(String),
    parameters String,
    src_topic LowCardinality(String),
    src_partition UInt32,
    src_offset UInt64,
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ingested_at)
ORDER BY (issued_at, command_id)
TTL toDateTime(ingested_at) + INTERVAL 400 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS ${database}.command_results
(
    schema_version UInt8,
    result_id UUID,
    command_id UUID,
    command_type LowCardinality(String),
    executor LowCardinality(String),
    status LowCardinality(String),
    detail String,
    received_at DateTime64(3, 'UTC'),
    completed_at DateTime64(3, 'UTC'),
    retry_after_s Nullable(Float64),
    src_topic LowCardinality(String),
    src_partition UInt32,
    src_offset UInt64,
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ingested_at)
ORDER BY (command_id, completed_at)
TTL toDateTime(ingested_at) + INTERVAL 400 DAY
SETTINGS non_replicated_deduplication_window = 10000;
