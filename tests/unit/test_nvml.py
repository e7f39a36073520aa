"""The NVML collector and node levers against a fake NVML with the real constants."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pynvml
import pytest

from agents.collectors.base import AcceleratorReader, NodeIdentity, SimulatedNodeReader
from agents.collectors.nvml import NvmlGpuReader, NvmlNodeControl, accelerator_type
from agents.executors.executors import NodeExecutor
from agents.executors.gate import CommandGate, PermanentActuatorError, execute
from agents.sim.scenario import Scenario
from agents.sim.simulation import Simulation
from schemas.base import AcceleratorType
from schemas.commands import (
    ClockMode,
    CommandResult,
    ResultStatus,
    RouteAction,
    RouteCommand,
    Target,
    ThrottleAction,
    ThrottleCommand,
)
from tests.factories import COMMAND_KEYS, START, signed_command
from tests.fake_nvml import FakeGpu, FakeNvml

HOST = NodeIdentity("node-7", "us-east", "pod-001", "rack-0003", "pdu-0003-a")
CORR, UNCORR = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOL, AGG = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC


def _fake() -> FakeNvml:
    full = FakeGpu(
        "GPU-aaaa",
        ecc={(CORR, VOL): 12, (UNCORR, VOL): 1, (CORR, AGG): 40, (UNCORR, AGG): 2},
        fields={
            pynvml.NVML_FI_DEV_MEMORY_TEMP: 70,
            pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: 5,
        },
        reasons=0x4,
    )
    sparse = FakeGpu(
        "GPU-bbbb",
        name="NVIDIA A100-SXM4-80GB",
        unsupported={
            "nvmlDeviceGetTotalEccErrors",
            "nvmlDeviceGetRemappedRows",
            "nvmlDeviceGetPcieReplayCounter",
            "nvmlDeviceGetCurrentClocksEventReasons",
        },
        retired={pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: [0x1000, 0x2000]},
    )
    return FakeNvml([full, sparse])


def _ids() -> uuid.UUID:
    return uuid.UUID(int=1)


def test_fields_map_to_the_schema_with_units_normalised() -> None:
    reader = NvmlGpuReader(HOST, nvml=_fake(), new_id=_ids)
    full, _ = reader.read(START)
    assert full.device_uuid == "GPU-aaaa" and full.device_index == 0
    assert full.accelerator_type is AcceleratorType.H100
    assert (full.node_id, full.rack_id, full.pdu_id) == ("node-7", "rack-0003", "pdu-0003-a")
    assert full.power_usage_watts == 350.0 and full.power_limit_watts == 700.0  # from mW
    assert full.gpu_util_ratio == 0.55 and full.mem_copy_util_ratio == 0.31  # from percent
    assert full.fb_used_bytes == 40 * 2**30 and full.fb_total_bytes == 80 * 2**30
    assert (full.sm_clock_mhz, full.mem_clock_mhz, full.gpu_temp_celsius) == (1980, 2619, 61)
    assert full.memory_temp_celsius == 70 and full.nvlink_errors_total == 5
    assert (full.ecc_sbe_volatile_total, full.ecc_dbe_volatile_total) == (12, 1)
    assert (full.ecc_sbe_aggregate_total, full.ecc_dbe_aggregate_total) == (40, 2)
    assert full.remapped_rows_total == 3 and full.retired_pages_total is None
    assert full.pcie_replay_total == 3 and full.clock_throttle_reasons == 0x4
    assert full.xid_last is None


def test_what_a_device_cannot_report_is_null_never_zero() -> None:
    _, sparse = NvmlGpuReader(HOST, nvml=_fake(), new_id=_ids).read(START)
    assert sparse.accelerator_type is AcceleratorType.A100
    assert sparse.ecc_sbe_volatile_total is None and sparse.ecc_dbe_aggregate_total is None
    assert sparse.remapped_rows_total is None and sparse.pcie_replay_total is None
    assert sparse.clock_throttle_reasons is None
    assert sparse.memory_temp_celsius is None and sparse.nvlink_errors_total is None
    assert sparse.retired_pages_total == 2  # pre-Ampere style page retirement
    assert sparse.gpu_temp_celsius == 61  # what is supported still comes through


def test_xid_events_since_the_last_read_then_none() -> None:
    nvml = _fake()
    reader = NvmlGpuReader(HOST, nvml=nvml, new_id=_ids)
    nvml.xid_queue += [(nvml.gpus[1], 31), (nvml.gpus[1], 79), (nvml.gpus[0], 48)]
    first = reader.read(START)
    assert [s.xid_last for s in first] == [48, 79]  # the last one per device
    assert [s.xid_last for s in reader.read(START + timedelta(seconds=1))] == [None, None]


def test_a_lost_gpu_is_left_out_and_named() -> None:
    nvml = _fake()
    reader = NvmlGpuReader(HOST, nvml=nvml, new_id=_ids)
    nvml.gpus[0].lost = True
    samples = reader.read(START)
    assert [s.device_uuid for s in samples] == ["GPU-bbbb"]
    assert reader.lost == {"GPU-aaaa"}
    nvml.gpus[0].lost = False
    assert len(reader.read(START)) == 2 and reader.lost == set()


def test_an_unknown_gpu_is_a_clear_error_and_sessions_close() -> None:
    with pytest.raises(ValueError, match="unsupported GPU 'NVIDIA T4'"):
        accelerator_type("NVIDIA T4")
    assert accelerator_type("NVIDIA H200") is AcceleratorType.H200
    nvml = _fake()
    NvmlGpuReader(HOST, nvml=nvml).close()
    assert nvml.initialised == 0


def test_the_simulator_and_nvml_share_the_reader_interface() -> None:
    sim = Simulation(Scenario(), start=START)
    sim.tick(0)
    readers: list[AcceleratorReader] = [
        NvmlGpuReader(HOST, nvml=_fake(), new_id=_ids),
        SimulatedNodeReader(sim, "node-00000"),
    ]
    for reader in readers:
        samples = reader.read(START)
        assert samples and all(s.observed_at == START for s in samples)


def _throttle(action: ThrottleAction, **fields: Any) -> ThrottleCommand:
    return signed_command(
        ThrottleCommand, issued_at=START, target=Target(node_id="node-7"), action=action, **fields
    )


def _execute(control: NvmlNodeControl, command: ThrottleCommand | RouteCommand) -> CommandResult:
    return execute(
        command,
        gate=CommandGate(keys=COMMAND_KEYS),
        actuator=NodeExecutor(control),
        executor="node-executor",
        received_at=START,
        now=START,
        new_id=uuid.uuid4,
    )


def test_node_executor_sets_power_limits_through_nvml_within_constraints() -> None:
    nvml = _fake()
    control = NvmlNodeControl(HOST, nvml=nvml)
    result = _execute(control, _throttle(ThrottleAction.POWER_CAP, power_limit_watts=450.0))
    assert result.status is ResultStatus.APPLIED, result.detail
    assert [g.limit_mw for g in nvml.gpus] == [450_000, 450_000]
    low = _execute(control, _throttle(ThrottleAction.POWER_CAP, power_limit_watts=100.0))
    assert low.status is ResultStatus.FAILED_PERMANENT
    assert "outside 200..700 W" in low.detail
    nvml.gpus[0].root = False
    denied = _execute(control, _throttle(ThrottleAction.POWER_CAP, power_limit_watts=500.0))
    assert denied.status is ResultStatus.FAILED_PERMANENT and "needs root" in denied.detail


def test_low_clock_mode_locks_clocks_and_default_resets_them() -> None:
    nvml = _fake()
    control = NvmlNodeControl(HOST, nvml=nvml)
    assert control.set_clock_mode("GPU-aaaa", ClockMode.LOW).endswith("1386 MHz")
    assert nvml.gpus[0].locked_clocks == (0, 1386)
    control.set_clock_mode("GPU-aaaa", ClockMode.DEFAULT)
    assert nvml.gpus[0].locked_clocks is None


def test_isolation_on_a_gpu_host_points_at_the_router_and_other_hosts_are_refused() -> None:
    control = NvmlNodeControl(HOST, nvml=_fake())
    drain = signed_command(
        RouteCommand, issued_at=START, target=Target(node_id="node-7"), action=RouteAction.DRAIN
    )
    result = _execute(control, drain)
    assert result.status is ResultStatus.FAILED_PERMANENT and "router" in result.detail
    with pytest.raises(PermanentActuatorError, match="node-8 is not this host"):
        control.devices(Target(node_id="node-8"))
