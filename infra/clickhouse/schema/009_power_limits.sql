-- The power limits a device's driver accepts (DCGM fields 161 and 162), so a controller
-- never asks for a cap the device must refuse. NULL: the device does not report them.
ALTER TABLE ${database}.accelerator_telemetry ADD COLUMN IF NOT EXISTS power_limit_min_watts Nullable(Float32) AFTER power_limit_watts;
ALTER TABLE ${database}.accelerator_telemetry ADD COLUMN IF NOT EXISTS power_limit_max_watts Nullable(Float32) AFTER power_limit_min_watts;
