-- Common-mode attribution: a verdict judges a device or a group (node, rack, cohort) whose
-- devices deviate together, and says why it was attributed to that level.

ALTER TABLE ${database}.verdicts ADD COLUMN IF NOT EXISTS level LowCardinality(String) DEFAULT 'device' AFTER cause_appended_at;
ALTER TABLE ${database}.verdicts ADD COLUMN IF NOT EXISTS scope Nullable(String) AFTER level;
ALTER TABLE ${database}.verdicts ADD COLUMN IF NOT EXISTS attribution String DEFAULT '' AFTER scope;
ALTER TABLE ${database}.verdicts ADD COLUMN IF NOT EXISTS members Nullable(UInt32) AFTER attribution;
