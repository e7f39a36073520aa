-- Serving telemetry says how much of what a replica served was optional work, so the
-- capacity controller and an SRE can tell baseline load from the budget it gave out.
ALTER TABLE ${database}.serving_metrics ADD COLUMN IF NOT EXISTS optional_requests Nullable(UInt64) AFTER errors;
