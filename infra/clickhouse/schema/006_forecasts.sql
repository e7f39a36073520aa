-- Demand forecasts: one row per (model, region, step, horizon), with the band and
-- the candidate model chosen by recent error, and the demand of the step it was
-- made from (so forecast error is one self-join away). Conventions as in 001.

CREATE TABLE IF NOT EXISTS ${database}.forecasts
(
    schema_version UInt8,
    forecast_id UUID,
    made_at DateTime64(3, 'UTC'),
    target_at DateTime64(3, 'UTC'),
    model LowCardinality(String),
    region LowCardinality(String),
    horizon_s Float32,
    step_s Float32,
    observed_rps Float64,
    point_rps Float64,
    low_rps Float64,
    high_rps Float64,
    chosen LowCardinality(String),
    src_topic LowCardinality(String),
    src_partition UInt32,
    src_offset UInt64,
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ingested_at)
ORDER BY (model, region, horizon_s, made_at)
TTL toDateTime(ingested_at) + INTERVAL 90 DAY
SETTINGS non_replicated_deduplication_window = 10000;
