"""The accelerator field catalogue, kept as data.

Each of our :class:`~schemas.events.AcceleratorTelemetry` metric fields maps to
the DCGM field it comes from, the unit DCGM reports it in, and the factor that
normalises it to the unit in our field name. Collectors for other vendors (ROCm
SMI, ASIC runtimes) map onto the same names; what a device cannot report stays
``None``.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One catalogue row: our field, DCGM's field id and name, and the unit factor."""

    field: str
    dcgm_id: int
    dcgm_name: str
    dcgm_unit: str
    scale: float = 1.0

    def normalise(self, raw: float | int | None) -> float | None:
        """DCGM value -> our unit; ``None`` stays ``None``."""
        return None if raw is None else float(raw) * self.scale


CATALOGUE: tuple[FieldSpec, ...] = (
    FieldSpec("gpu_temp_celsius", 150, "DCGM_FI_DEV_GPU_TEMP", "C"),
    FieldSpec("memory_temp_celsius", 140, "DCGM_FI_DEV_MEMORY_TEMP", "C"),
    FieldSpec("power_usage_watts", 155, "DCGM_FI_DEV_POWER_USAGE", "W"),
    FieldSpec("power_limit_watts", 160, "DCGM_FI_DEV_POWER_MGMT_LIMIT", "W"),
    FieldSpec("power_limit_min_watts", 161, "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN", "W"),
    FieldSpec("power_limit_max_watts", 162, "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX", "W"),
    FieldSpec("sm_clock_mhz", 100, "DCGM_FI_DEV_SM_CLOCK", "MHz"),
    FieldSpec("mem_clock_mhz", 101, "DCGM_FI_DEV_MEM_CLOCK", "MHz"),
    FieldSpec("gpu_util_ratio", 203, "DCGM_FI_DEV_GPU_UTIL", "%", 0.01),
    FieldSpec("mem_copy_util_ratio", 204, "DCGM_FI_DEV_MEM_COPY_UTIL", "%", 0.01),
    FieldSpec("fb_used_bytes", 252, "DCGM_FI_DEV_FB_USED", "MiB", MIB),
    FieldSpec("fb_total_bytes", 250, "DCGM_FI_DEV_FB_TOTAL", "MiB", MIB),
    FieldSpec("ecc_sbe_volatile_total", 310, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "count"),
    FieldSpec("ecc_dbe_volatile_total", 311, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "count"),
    FieldSpec("ecc_sbe_aggregate_total", 312, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "count"),
    FieldSpec("ecc_dbe_aggregate_total", 313, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "count"),
    FieldSpec("retired_pages_total", 390, "DCGM_FI_DEV_RETIRED_SBE", "count"),
    FieldSpec("remapped_rows_total", 393, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "count"),
    FieldSpec("xid_last", 230, "DCGM_FI_DEV_XID_ERRORS", "code"),
    FieldSpec("pcie_replay_total", 202, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "count"),
    FieldSpec("nvlink_errors_total", 409, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "count"),
    FieldSpec("clock_throttle_reasons", 112, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "bitmask"),
)

BY_FIELD = {f.field: f for f in CATALOGUE}

# DCGM clock-event reason bits (DCGM_CLOCKS_EVENT_REASON_*, formerly THROTTLE_REASON_*)
CLOCKS_SW_POWER_CAP = 0x4
CLOCKS_HW_SLOWDOWN = 0x8
CLOCKS_SW_THERMAL = 0x20
CLOCKS_HW_THERMAL = 0x40
CLOCKS_HW_POWER_BRAKE = 0x80
CLOCKS_THERMAL = CLOCKS_HW_SLOWDOWN | CLOCKS_SW_THERMAL | CLOCKS_HW_THERMAL
"""Reasons that mean the device is too hot (hardware slowdown is mostly thermal)."""

FATAL_XIDS: frozenset[int] = frozenset(
    {
        48,  # double-bit ECC error
        63,  # row remapping failure / page retirement event
        64,  # row remapping or page retirement failed
        74,  # NVLink error
        79,  # fallen off the bus
        92,  # high single-bit ECC rate
        94,  # contained ECC error
        95,  # uncontained ECC error
        119,  # GSP RPC timeout
        120,  # GSP error
        140,  # unrecovered ECC error
    }
)
"""XIDs after which NVIDIA's guidance is to stop work and reset or replace the GPU.

Other XIDs (13 graphics exception, 31 MMU fault, 43 reset channel...) are often
the application's; they count against a device only when they keep coming.
"""
