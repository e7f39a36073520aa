"""NVIDIA GPUs through NVML (nvidia-ml-py): the real collector and the node levers.

:class:`NvmlGpuReader` maps NVML to the schema's DCGM vocabulary, normalising
units at the edge (milliwatts -> watts, percent -> ratio). A query the device
or driver does not support (``NOT_SUPPORTED``, ``NO_PERMISSION``,
``FUNCTION_NOT_FOUND``) gives ``None`` for that field, never 0. XIDs come from
an NVML event set polled without blocking: ``xid_last`` is the last XID raised
since the previous read, ``None`` when none was. A device that has fallen off
the bus (``GPU_IS_LOST``) is left out of the read and named in ``lost``.

:class:`NvmlNodeControl` is the node executor's :class:`NodeControl` on a GPU
host: power limits (within the driver's constraints) and locked clocks where
the driver allows them; isolation of a host is the router's job, so the
admission-state lever answers with a permanent error naming that.

The ``nvml`` module is injectable: tests pass a fake with the same names.

Example::

    reader = NvmlGpuReader(NodeIdentity("node-7", "us-east", "pod-1", "rack-3", "pdu-3-a"))
    samples = reader.read(datetime.now(UTC))
"""

from __future__ import annotations

import importlib
import logging
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from agents.collectors.base import NodeIdentity
from agents.executors.gate import PermanentActuatorError, TransientActuatorError
from schemas.base import AcceleratorType
from schemas.commands import ClockMode, RouteAction, Target
from schemas.events import AcceleratorTelemetry

log = logging.getLogger(__name__)
T = TypeVar("T")

NAME_TO_TYPE = (  # substrings of nvmlDeviceGetName, most specific first
    ("B200", AcceleratorType.B200),
    ("H200", AcceleratorType.H200),
    ("H100", AcceleratorType.H100),
    ("A100", AcceleratorType.A100),
)
LOW_CLOCK_RATIO = 0.7


def accelerator_type(name: str) -> AcceleratorType:
    """The schema's type for an NVML product name; a clear error for others."""
    for needle, kind in NAME_TO_TYPE:
        if needle in name:
            return kind
    known = ", ".join(n for n, _ in NAME_TO_TYPE)
    raise ValueError(f"unsupported GPU {name!r}: fleetloop knows {known}")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlSession:
    """An initialised NVML with its device handles by UUID; ``close()`` shuts it down."""

    def __init__(self, nvml: Any = None) -> None:
        self.nvml = nvml if nvml is not None else importlib.import_module("pynvml")
        self.nvml.nvmlInit()
        self.unsupported = {
            self.nvml.NVML_ERROR_NOT_SUPPORTED,
            self.nvml.NVML_ERROR_NO_PERMISSION,
            self.nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        }
        self.handles: dict[str, Any] = {}
        self.indexes: dict[str, int] = {}
        self.names: dict[str, str] = {}
        for i in range(self.nvml.nvmlDeviceGetCount()):
            h = self.nvml.nvmlDeviceGetHandleByIndex(i)
            u = _text(self.nvml.nvmlDeviceGetUUID(h))
            self.handles[u], self.indexes[u] = h, i
            self.names[u] = _text(self.nvml.nvmlDeviceGetName(h))

    def optional(self, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(*args)``, or None when the device or driver does not support it."""
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            if exc.value in self.unsupported:
                return None
            raise

    def close(self) -> None:
        self.nvml.nvmlShutdown()


class NvmlGpuReader:
    """Reads every NVIDIA GPU of this host; implements ``AcceleratorReader``."""

    def __init__(
        self,
        identity: NodeIdentity,
        *,
        nvml: Any = None,
        session: NvmlSession | None = None,
        new_id: Callable[[], uuid.UUID] = uuid.uuid4,
    ) -> None:
        self.identity = identity
        self.session = session or NvmlSession(nvml)
        self.nvml = self.session.nvml
        self.new_id = new_id
        self.types = {u: accelerator_type(n) for u, n in self.session.names.items()}
        self.lost: set[str] = set()
        self._events = self._register_xid_events()

    def _register_xid_events(self) -> Any:
        nvml, s = self.nvml, self.session
        events = s.optional(nvml.nvmlEventSetCreate)
        if events is None:
            return None
        for h in s.handles.values():
            s.optional(nvml.nvmlDeviceRegisterEvents, h, nvml.nvmlEventTypeXidCriticalError, events)
        return events

    def _pending_xids(self) -> dict[str, int]:
        """The last XID per device raised since the previous read (never blocks)."""
        out: dict[str, int] = {}
        if self._events is None:
            return out
        while True:
            try:
                data = self.nvml.nvmlEventSetWait(self._events, 0)
            except self.nvml.NVMLError as exc:
                if exc.value != self.nvml.NVML_ERROR_TIMEOUT:
                    log.warning("NVML event wait failed: %s", exc)
                return out
            if data.eventType & self.nvml.nvmlEventTypeXidCriticalError:
                out[_text(self.nvml.nvmlDeviceGetUUID(data.device))] = int(data.eventData)

    def read(self, now: datetime) -> list[AcceleratorTelemetry]:
        xids = self._pending_xids()
        out = []
        for u, h in self.session.handles.items():
            try:
                out.append(self._sample(u, h, now, xids.get(u)))
                self.lost.discard(u)
            except self.nvml.NVMLError as exc:
                if exc.value != self.nvml.NVML_ERROR_GPU_IS_LOST:
                    raise
                if u not in self.lost:
                    log.error("GPU %s is lost (fallen off the bus)", u)
                self.lost.add(u)
        return out

    def _sample(
        self, device_uuid: str, handle: Any, now: datetime, xid: int | None
    ) -> AcceleratorTelemetry:
        nvml, opt = self.nvml, self.session.optional
        watts = _scaled(opt(nvml.nvmlDeviceGetPowerUsage, handle), 1e-3)
        limit = _scaled(opt(nvml.nvmlDeviceGetEnforcedPowerLimit, handle), 1e-3)
        limits_mw = opt(nvml.nvmlDeviceGetPowerManagementLimitConstraints, handle)
        util = opt(nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = opt(nvml.nvmlDeviceGetMemoryInfo, handle)
        corrected, uncorrected = (
            nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        )
        volatile, aggregate = nvml.NVML_VOLATILE_ECC, nvml.NVML_AGGREGATE_ECC
        remapped = opt(nvml.nvmlDeviceGetRemappedRows, handle)
        retired = self._retired_pages(handle)
        id_ = self.identity
        return AcceleratorTelemetry(
            event_id=self.new_id(),
            observed_at=now,
            node_id=id_.node_id,
            device_uuid=device_uuid,
            device_index=self.session.indexes[device_uuid],
            accelerator_type=self.types[device_uuid],
            region=id_.region,
            pod_id=id_.pod_id,
            rack_id=id_.rack_id,
            pdu_id=id_.pdu_id,
            gpu_temp_celsius=opt(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
            memory_temp_celsius=self._field(handle, nvml.NVML_FI_DEV_MEMORY_TEMP),
            power_usage_watts=watts,
            power_limit_watts=limit,
            power_limit_min_watts=None if limits_mw is None else limits_mw[0] / 1000,
            power_limit_max_watts=None if limits_mw is None else limits_mw[1] / 1000,
            sm_clock_mhz=opt(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
            mem_clock_mhz=opt(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
            gpu_util_ratio=None if util is None else util.gpu / 100.0,
            mem_copy_util_ratio=None if util is None else util.memory / 100.0,
            fb_used_bytes=None if memory is None else int(memory.used),
            fb_total_bytes=None if memory is None else int(memory.total),
            ecc_sbe_volatile_total=opt(
                nvml.nvmlDeviceGetTotalEccErrors, handle, corrected, volatile
            ),
            ecc_dbe_volatile_total=opt(
                nvml.nvmlDeviceGetTotalEccErrors, handle, uncorrected, volatile
            ),
            ecc_sbe_aggregate_total=opt(
                nvml.nvmlDeviceGetTotalEccErrors, handle, corrected, aggregate
            ),
            ecc_dbe_aggregate_total=opt(
                nvml.nvmlDeviceGetTotalEccErrors, handle, uncorrected, aggregate
            ),
            retired_pages_total=retired,
            remapped_rows_total=None if remapped is None else int(remapped[0] + remapped[1]),
            xid_last=xid,
            pcie_replay_total=opt(nvml.nvmlDeviceGetPcieReplayCounter, handle),
            nvlink_errors_total=self._field(
                handle, nvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
            ),
            clock_throttle_reasons=self._clock_reasons(handle),
        )

    def _retired_pages(self, handle: Any) -> int | None:
        nvml, opt = self.nvml, self.session.optional
        pages = [
            opt(nvml.nvmlDeviceGetRetiredPages, handle, cause)
            for cause in (
                nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
            )
        ]
        if all(p is None for p in pages):
            return None  # row remapping replaced page retirement (Ampere and later)
        return sum(len(p) for p in pages if p is not None)

    def _clock_reasons(self, handle: Any) -> int | None:
        nvml, opt = self.nvml, self.session.optional
        fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        return None if fn is None else opt(fn, handle)

    def _field(self, handle: Any, field_id: int) -> float | None:
        """A field value, or None when the driver does not report it for this device."""
        values = self.session.optional(self.nvml.nvmlDeviceGetFieldValues, handle, [field_id])
        if not values or values[0].nvmlReturn != self.nvml.NVML_SUCCESS:
            return None
        v = values[0]
        kind = v.valueType
        if kind == self.nvml.NVML_VALUE_TYPE_DOUBLE:
            return float(v.value.dVal)
        member = {
            self.nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
            self.nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
            self.nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
            self.nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
            self.nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        }.get(kind)
        return None if member is None else float(getattr(v.value, member))

    def close(self) -> None:
        if self._events is not None:
            self.session.optional(self.nvml.nvmlEventSetFree, self._events)
        self.session.close()


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


class NvmlNodeControl:
    """The node executor's levers on a GPU host, through NVML (needs root for limits)."""

    def __init__(
        self, identity: NodeIdentity, *, nvml: Any = None, session: NvmlSession | None = None
    ) -> None:
        self.identity = identity
        self.session = session or NvmlSession(nvml)
        self.nvml = self.session.nvml

    def devices(self, target: Target) -> list[str]:
        if target.node_id and target.node_id != self.identity.node_id:
            raise PermanentActuatorError(f"{target.node_id} is not this host")
        if target.device_uuid:
            if target.device_uuid not in self.session.handles:
                raise PermanentActuatorError(f"no GPU {target.device_uuid} on this host")
            return [target.device_uuid]
        return list(self.session.handles)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except self.nvml.NVMLError as exc:
            if exc.value == self.nvml.NVML_ERROR_NO_PERMISSION:
                raise PermanentActuatorError(f"{what}: needs root on this host") from exc
            if exc.value in self.session.unsupported:
                raise PermanentActuatorError(f"{what}: not supported by this GPU") from exc
            raise TransientActuatorError(f"{what}: {exc}", retry_after_s=5.0) from exc

    def set_power_limit(self, device_uuid: str, watts: float) -> str:
        h = self.session.handles[device_uuid]
        lo_mw, hi_mw = self.nvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
        if not lo_mw <= watts * 1000 <= hi_mw:
            lo, hi = lo_mw / 1000, hi_mw / 1000
            raise PermanentActuatorError(
                f"{device_uuid}: power limit {watts:g} W outside {lo:g}..{hi:g} W"
            )
        self._call("power limit", self.nvml.nvmlDeviceSetPowerManagementLimit, h, int(watts * 1000))
        return f"{device_uuid} power limit {watts:g} W"

    def set_clock_mode(self, device_uuid: str, mode: ClockMode) -> str:
        h = self.session.handles[device_uuid]
        if mode is ClockMode.DEFAULT:
            self._call("clock reset", self.nvml.nvmlDeviceResetGpuLockedClocks, h)
            return f"{device_uuid} clocks default"
        top = self.nvml.nvmlDeviceGetMaxClockInfo(h, self.nvml.NVML_CLOCK_SM)
        ceiling = int(top * LOW_CLOCK_RATIO)
        self._call("clock lock", self.nvml.nvmlDeviceSetGpuLockedClocks, h, 0, ceiling)
        return f"{device_uuid} clocks locked at most {ceiling} MHz"

    def set_admission_state(
        self, device_uuid: str, action: RouteAction, *, weight_ratio: float | None
    ) -> str:
        raise PermanentActuatorError(
            f"{action.value} on {device_uuid}: this host has no serving-runtime hook; "
            "send it to the router (a route command addressed to the pool and this host)"
        )
