-- Commands carry what caused them (the triggering event and the controller
-- decision), for event-to-action latency. Tables created before these columns
-- existed get them here; on a fresh database this changes nothing.

ALTER TABLE ${database}.commands ADD COLUMN IF NOT EXISTS cause_event_id Nullable(UUID) AFTER message;
ALTER TABLE ${database}.commands ADD COLUMN IF NOT EXISTS cause_observed_at Nullable(DateTime64(3, 'UTC')) AFTER cause_event_id;
ALTER TABLE ${database}.commands ADD COLUMN IF NOT EXISTS decision_id Nullable(UUID) AFTER cause_observed_at;
