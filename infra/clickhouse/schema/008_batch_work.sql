-- Deferrable batch work in serving telemetry: how much of a replica's requests were batch
-- jobs (what the power controller may move to a pool with headroom). NULL: not known.
ALTER TABLE ${database}.serving_metrics ADD COLUMN IF NOT EXISTS batch_requests Nullable(UInt64) AFTER optional_requests;
