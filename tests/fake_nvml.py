"""A fake NVML: the real pynvml's constants and error class, with the driver calls
answered from per-GPU state. Each GPU can refuse any call by name (``NOT_SUPPORTED``),
be lost off the bus, or lack root for setters."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pynvml

MW = 1000


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    temp_c: int = 61
    power_mw: int = 350_000
    limit_mw: int = 700_000
    constraints_mw: tuple[int, int] = (200_000, 700_000)
    sm_mhz: int = 1980
    mem_mhz: int = 2619
    max_sm_mhz: int = 1980
    util: tuple[int, int] = (55, 31)
    memory: tuple[int, int] = (40 * 2**30, 80 * 2**30)  # used, total
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)  # (type, counter) -> n
    remapped: tuple[int, int, int, int] = (2, 1, 0, 0)
    retired: dict[int, list[int]] | None = None  # None: page retirement not supported
    pcie_replays: int = 3
    fields: dict[int, int] = field(default_factory=dict)
    reasons: int = 0
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    root: bool = True
    locked_clocks: tuple[int, int] | None = None


class FakeNvml(SimpleNamespace):
    """Module-like: pass it as ``nvml=`` where the real module would go."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__()
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType")) or name == "NVMLError":
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.xid_queue: list[tuple[FakeGpu, int]] = []
        self.initialised = 0

    def _err(self, code: int) -> Exception:
        return cast(Exception, pynvml.NVMLError(code))

    def _gpu(self, handle: FakeGpu, fn: str) -> FakeGpu:
        if handle.lost:
            raise self._err(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in handle.unsupported:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return handle

    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return handle.name

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu(handle, "nvmlDeviceGetTemperature").temp_c

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeGpu) -> int:
        return self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit").limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: FakeGpu) -> list[int]:
        return list(
            self._gpu(handle, "nvmlDeviceGetPowerManagementLimitConstraints").constraints_mw
        )

    def nvmlDeviceSetPowerManagementLimit(self, handle: FakeGpu, mw: int) -> None:
        g = self._gpu(handle, "nvmlDeviceSetPowerManagementLimit")
        if not g.root:
            raise self._err(pynvml.NVML_ERROR_NO_PERMISSION)
        g.limit_mw = mw

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, kind: int) -> int:
        g = self._gpu(handle, "nvmlDeviceGetClockInfo")
        return g.sm_mhz if kind == pynvml.NVML_CLOCK_SM else g.mem_mhz

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeGpu, kind: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxClockInfo").max_sm_mhz

    def nvmlDeviceSetGpuLockedClocks(self, handle: FakeGpu, lo: int, hi: int) -> None:
        g = self._gpu(handle, "nvmlDeviceSetGpuLockedClocks")
        if not g.root:
            raise self._err(pynvml.NVML_ERROR_NO_PERMISSION)
        g.locked_clocks = (lo, hi)

    def nvmlDeviceResetGpuLockedClocks(self, handle: FakeGpu) -> None:
        self._gpu(handle, "nvmlDeviceResetGpuLockedClocks").locked_clocks = None

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> Any:
        g = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=g.util[0], memory=g.util[1])

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> Any:
        g = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        used, total = g.memory
        return SimpleNamespace(used=used, total=total, free=total - used)

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeGpu, kind: int, counter: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetTotalEccErrors").ecc.get((kind, counter), 0)

    def nvmlDeviceGetRemappedRows(self, handle: FakeGpu) -> tuple[int, int, int, int]:
        return self._gpu(handle, "nvmlDeviceGetRemappedRows").remapped

    def nvmlDeviceGetRetiredPages(self, handle: FakeGpu, cause: int) -> list[int]:
        g = self._gpu(handle, "nvmlDeviceGetRetiredPages")
        if g.retired is None:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g.retired.get(cause, [])

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeGpu) -> int:
        return self._gpu(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replays

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").reasons

    def nvmlDeviceGetFieldValues(self, handle: FakeGpu, ids: list[int]) -> list[Any]:
        g = self._gpu(handle, "nvmlDeviceGetFieldValues")
        out = []
        for i in ids:
            ok = i in g.fields
            out.append(
                SimpleNamespace(
                    fieldId=i,
                    nvmlReturn=pynvml.NVML_SUCCESS if ok else pynvml.NVML_ERROR_NOT_SUPPORTED,
                    valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                    value=SimpleNamespace(ullVal=g.fields.get(i, 0)),
                )
            )
        return out

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, handle: FakeGpu, kinds: int, events: object) -> None:
        self._gpu(handle, "nvmlDeviceRegisterEvents")

    def nvmlEventSetWait(self, events: object, timeout_ms: int) -> Any:
        if not self.xid_queue:
            raise self._err(pynvml.NVML_ERROR_TIMEOUT)
        gpu, xid = self.xid_queue.pop(0)
        return SimpleNamespace(
            device=gpu, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid
        )

    def nvmlEventSetFree(self, events: object) -> None:
        pass
