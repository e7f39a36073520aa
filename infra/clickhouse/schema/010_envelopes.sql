-- Node-tick envelopes (telemetry contract v2): each row is still one device's (or one
-- replica's) sample; sample_index says which sample of its envelope it was (0 for a v1
-- message). A bad sample inside a good envelope is dead-lettered alone: source_index is
-- its place in the envelope (null when the whole message was refused).
-- For databases made before these columns; new ones get them from 001.
ALTER TABLE ${database}.accelerator_telemetry
    ADD COLUMN IF NOT EXISTS sample_index UInt16 DEFAULT 0 AFTER src_offset;
ALTER TABLE ${database}.serving_metrics
    ADD COLUMN IF NOT EXISTS sample_index UInt16 DEFAULT 0 AFTER src_offset;
ALTER TABLE ${database}.dead_letters
    ADD COLUMN IF NOT EXISTS source_index Nullable(UInt32) AFTER source_offset;
