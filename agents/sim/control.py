"""The simulated fleet's levers: node, router and warmer controls over one :class:`Fleet`.

Commands change fleet state between steps, so the next step's routing, power
and thermal models (and therefore the telemetry) show their effect.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agents.executors.gate import PermanentActuatorError, TransientActuatorError
from agents.sim.fleet import Fleet
from agents.sim.hardware import MODELS
from agents.sim.state import AdminState, Device
from schemas.commands import ClockMode, RouteAction, Target

ADMISSION = {
    RouteAction.DEWEIGHT: AdminState.DEWEIGHTED,
    RouteAction.STOP_NEW_SESSIONS: AdminState.NO_NEW_SESSIONS,
    RouteAction.DRAIN: AdminState.DRAINING,
    RouteAction.QUARANTINE: AdminState.QUARANTINED,
    RouteAction.RESTORE: AdminState.ACTIVE,
}
STRICTNESS = {state: rank for rank, state in enumerate(AdminState)}  # active .. quarantined
RETRY_WHEN_NO_CAPACITY_S = 30.0


class SimControl:
    """Implements NodeControl, RouterControl and WarmerControl on the simulated fleet."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def _device(self, uuid: str) -> Device:
        try:
            return self.fleet.devices[uuid]
        except KeyError:
            raise PermanentActuatorError(f"unknown device {uuid!r}") from None

    # -- node -------------------------------------------------------------------------------

    def devices(self, target: Target) -> list[str]:
        if target.device_uuid:
            dev = self._device(target.device_uuid)
            if target.node_id and dev.node.node_id != target.node_id:
                raise PermanentActuatorError(f"{dev.uuid} is not on {target.node_id}")
            return [dev.uuid]
        node = self.fleet.node(target.node_id or "")
        if node is None:
            raise PermanentActuatorError(f"unknown node {target.node_id!r}")
        return [d.uuid for d in node.devices]

    def set_admission_state(
        self, device_uuid: str, action: RouteAction, *, weight_ratio: float | None
    ) -> str:
        dev = self._device(device_uuid)
        wanted = ADMISSION[action]
        if action is not RouteAction.RESTORE and STRICTNESS[wanted] < STRICTNESS[dev.admin]:
            # a controller that forgot (a restart) must not hand a drained or quarantined
            # device traffic again: only a restore loosens it
            return f"{dev.uuid} stays {dev.admin.value}: only a restore loosens it"
        dev.admin = wanted
        ratio = weight_ratio if action is RouteAction.DEWEIGHT else None
        dev.weight_ratio = 1.0 if ratio is None else ratio  # a weight of 0 is 0
        if action is RouteAction.DEWEIGHT:
            return f"{dev.uuid} weight {dev.weight_ratio:g}"
        return f"{dev.uuid} {dev.admin.value}"

    def set_power_limit(self, device_uuid: str, watts: float) -> str:
        dev = self._device(device_uuid)
        lo, hi = dev.spec.min_power_limit_watts, dev.spec.power_limit_watts
        if not lo <= watts <= hi:
            raise PermanentActuatorError(
                f"{dev.uuid}: power limit {watts:g} W outside {lo:g}..{hi:g} W"
            )
        dev.power_cap_watts = watts
        return f"{dev.uuid} power limit {watts:g} W"

    def set_clock_mode(self, device_uuid: str, mode: ClockMode) -> str:
        dev = self._device(device_uuid)
        dev.clock_mode = mode
        return f"{dev.uuid} clocks {mode.value}"

    # -- router -----------------------------------------------------------------------------

    def pool_devices(self, pool: str, target: Target) -> list[str]:
        return [u for u in self.devices(target) if self.fleet.devices[u].pool == pool]

    def set_pool_weight(self, pool: str, model: str | None, ratio: float) -> str:
        self._check_pool(pool)
        self.fleet.router.pool_weights[(model or "*", pool)] = ratio
        return f"{pool} weight {ratio:g} for {model or 'every model'}"

    def set_ejected(self, device_uuids: list[str], *, ejected: bool) -> str:
        for u in device_uuids:
            (self.fleet.router.ejected.add if ejected else self.fleet.router.ejected.discard)(u)
        verb = "ejected" if ejected else "readmitted"
        return f"{verb} {len(device_uuids)} device(s): {', '.join(device_uuids[:4])}"

    def set_replica_weight(self, device_uuids: list[str], ratio: float) -> str:
        weights = self.fleet.router.replica_weights
        for u in device_uuids:
            if ratio >= 1.0:
                weights.pop(u, None)
            else:
                weights[u] = ratio
        return f"weight {ratio:g} for {len(device_uuids)} replica(s): {', '.join(device_uuids[:4])}"

    def set_pool_lever(self, pool: str, lever: str, value: float) -> str:
        self._check_pool(pool)
        r = self.fleet.router
        if lever == "batch_size":
            r.batch_size_max[pool] = max(1, int(value))
        elif lever == "admission":
            r.admission_ratio[pool] = value
        elif lever == "optional_budget":
            r.optional_budget_ratio[pool] = value
        elif lever in ("funnel_extra_candidates", "upgrade_ratio"):
            r.optional_levers.setdefault(pool, {})[lever] = value
        else:
            raise PermanentActuatorError(f"unknown pool lever {lever!r}")
        return f"{pool} {lever} {value:g}"

    def move_batch(self, pool: str, rack_id: str, ratio: float, to_pool: str | None) -> str:
        self._check_pool(pool)
        if not any(r.rack_id == rack_id for r in self.fleet.racks):
            raise PermanentActuatorError(f"unknown rack {rack_id!r}")
        moves = self.fleet.batch.moves
        if ratio <= 0:
            moves.pop((pool, rack_id), None)
            return f"{pool} batch work back on {rack_id}"
        assert to_pool is not None  # the command's contract
        self._check_pool(to_pool)
        moves[(pool, rack_id)] = (ratio, to_pool)
        where = "its other racks" if to_pool == pool else to_pool
        return f"{ratio:.0%} of {pool}'s batch work on {rack_id} moved to {where}"

    def _check_pool(self, pool: str) -> None:
        if not any(d.pool == pool for d in self.fleet.devices.values()):
            pools = sorted({d.pool for d in self.fleet.devices.values()})
            raise PermanentActuatorError(f"unknown pool {pool!r}; pools: {', '.join(pools)}")

    def table(self) -> dict[str, Any]:
        f, t = self.fleet, self.fleet.t_s
        routes: dict[str, list[dict[str, Any]]] = {}
        for dev in f.devices.values():
            if dev.model is None:
                continue
            weight = (
                f.router.weight(dev.model, dev.pool)
                * f.router.replica_weights.get(dev.uuid, 1.0)
                * f.device_weight(dev)
            )
            routes.setdefault(dev.model, []).append(
                {
                    "device_uuid": dev.uuid,
                    "node_id": dev.node.node_id,
                    "pool": dev.pool,
                    "weight": round(weight, 4),
                    "serving": dev.serving(t),
                    "ejected": dev.uuid in f.router.ejected,
                    "admin_state": dev.admin.value,
                }
            )
        r = f.router
        return {
            "at": f.now.isoformat(),
            "pool_weights": {f"{m}@{p}": w for (m, p), w in sorted(r.pool_weights.items())},
            "admission_ratio": dict(sorted(r.admission_ratio.items())),
            "batch_size_max": dict(sorted(r.batch_size_max.items())),
            "optional_budget_ratio": dict(sorted(r.optional_budget_ratio.items())),
            "optional_levers": dict(sorted(r.optional_levers.items())),
            "batch_moves": {
                f"{pool}@{rack}": {"ratio": ratio, "to_pool": to}
                for (pool, rack), (ratio, to) in sorted(f.batch.moves.items())
            },
            "routes": {
                m: sorted(v, key=lambda e: e["device_uuid"]) for m, v in sorted(routes.items())
            },
        }

    # -- warmer -----------------------------------------------------------------------------

    def warm(self, pool: str, model: str, replicas: int, *, now: datetime) -> str:
        self._check_pool(pool)
        spec = MODELS.get(model)
        if spec is None:
            raise PermanentActuatorError(f"unknown model {model!r}; known: {sorted(MODELS)}")
        free = [
            d
            for d in self.fleet.devices.values()
            if d.pool == pool
            and d.model is None
            and d.admin is AdminState.ACTIVE
            and not (d.failed or d.lost or d.node.down)
        ]
        if free and not free[0].spec.fits(spec):
            raise PermanentActuatorError(f"{model} does not fit {free[0].spec.kind.value} memory")
        if not free:
            raise TransientActuatorError(
                f"no free device in {pool}", retry_after_s=RETRY_WHEN_NO_CAPACITY_S
            )
        chosen = sorted(free, key=lambda d: (d.node.index, d.index))[:replicas]
        t = self.fleet.t_s
        load_s = chosen[0].spec.load_time_s(spec)
        for d in chosen:
            d.model, d.ready_at_s, d.queue = model, t + load_s, 0.0
        short = (
            f" ({replicas - len(chosen)} short: no free device)" if len(chosen) < replicas else ""
        )
        return (
            f"loading {model} on {len(chosen)} device(s) in {pool}, serving in {load_s:.0f}s{short}"
        )

    def cool(self, pool: str, model: str, replicas: int, *, now: datetime) -> str:
        self._check_pool(pool)
        loaded = [d for d in self.fleet.devices.values() if d.pool == pool and d.model == model]
        if not loaded:
            raise PermanentActuatorError(f"{model} is not loaded in {pool}")
        idle_first = sorted(loaded, key=lambda d: (d.queue + d.offered_rps, d.node.index, d.index))
        chosen = idle_first[:replicas]
        for d in chosen:
            d.model, d.queue, d.ready_at_s = None, 0.0, 0.0
        return f"unloaded {model} from {len(chosen)} device(s) in {pool}"
