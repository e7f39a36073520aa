-- Health verdicts (one row per judgement the health processor published) and
-- controller decisions (what a controller wanted, what came of it and why:
-- issued, refused by a stage such as the guardrail, or advisory). Same
-- conventions as 001: Kafka coordinates per row, partitions and TTLs by
-- ingestion time, ordering key for the questions SREs ask ("this device,
-- over time"; "this reason, over time").

CREATE TABLE IF NOT EXISTS ${database}.verdicts
(
    schema_version UInt8,
    verdict_id UUID,
    observed_at DateTime64(3, 'UTC'),
    device_uuid String,
    node_id String,
    region LowCardinality(String),
    rack_id LowCardinality(String),
    pool LowCardinality(String),
    accelerator_type LowCardinality(String),
    status LowCardinality(String),
    previous_status LowCardinality(String),
    score Float32,
    evidence String,
    signals Array(Tuple(
        name LowCardinality(String),
        value Float64,
        threshold Float64
    )),
    cause_event_id Nullable(UUID),
    cause_appended_at Nullable(DateTime64(3, 'UTC')),
    src_topic LowCardinality(String),
    src_partition UInt32,
    src_offset UInt64,
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ingested_at)
ORDER BY (device_uuid, observed_at)
TTL toDateTime(ingested_at) + INTERVAL 90 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS ${database}.decisions
(
    schema_version UInt8,
    decision_id UUID,
    decided_at DateTime64(3, 'UTC'),
    controller LowCardinality(String),
    target String,
    pool Nullable(String),
    rack_id Nullable(String),
    action LowCardinality(String),
    outcome LowCardinality(String),
    reason LowCardinality(String),
    message String,
    verdict_id Nullable(UUID),
    verdict_status Nullable(String),
    command_id Nullable(UUID),
    cause_event_id Nullable(UUID),
    cause_observed_at Nullable(DateTime64(3, 'UTC')),
    cause_appended_at Nullable(DateTime64(3, 'UTC')),
    p_term Nullable(Float64),
    i_term Nullable(Float64),
    d_term Nullable(Float64),
    desired Nullable(Float64),
    applied Nullable(Float64),
    src_topic LowCardinality(String),
    src_partition UInt32,
    src_offset UInt64,
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ingested_at)
ORDER BY (controller, decided_at, target)
TTL toDateTime(ingested_at) + INTERVAL 400 DAY
SETTINGS non_replicated_deduplication_window = 10000;

-- A serving replica names the accelerator it runs on (null when it spans several),
-- so health can compare one device's latency with its peers'.
ALTER TABLE ${database}.serving_metrics ADD COLUMN IF NOT EXISTS device_uuid Nullable(String) AFTER node_id;
