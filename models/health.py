"""Online health detection: hard faults at once, soft signals through online models.

:class:`HealthDetector` takes the telemetry of the devices of the nodes it
owns (a partition's worth), one event at a time, and returns the
:class:`~schemas.verdicts.Verdict` of a device whenever its status changes
(and at least every ``verdict_interval_s`` while it reports, in a slot of the interval
that its id fixes, so a fleet's keep-alives spread over it). Time is the
events' own (``observed_at``); nothing reads a clock.

Hard faults make a device ``failed`` within the event that shows them:

- a fatal XID (:data:`schemas.dcgm.FATAL_XIDS`) or a double-bit ECC error;
- a failed probe, a device that stops reporting while its node heartbeats;
- a node whose heartbeats stop for ``heartbeat_timeout_s`` (all its devices).

Silence is measured against the progress of the source the samples come from
(a topic partition, passed as ``source``): a node is silent when its
partition-mates' heartbeats are ``heartbeat_timeout_s`` ahead of its last, so
consumer lag or skew between partitions never fakes it. A source that goes
quiet as a whole (a node alone on its partition) counts once the broker says
the partition was read to its end, or else after ``stall_wall_s`` of
processing time, and not at all when more than ``blind_ratio`` of the known
nodes went quiet that way together: that is the pipeline going blind, not the
fleet dying, and it stays static. A silence verdict is dated when the silence
became evidence (the last word plus ``heartbeat_timeout_s``, on the broker's
clock) and names no cause event, whichever event or tick it was judged on: a
heartbeat topic read behind the telemetry must not date a crash before it
happened.

Soft signals are scored before they are learned, and a device that is over a
threshold for ``sustain_s`` is ``dying`` (``suspect`` before that):

- ``ecc_sbe_rise``: the correctable ECC counter through a Poisson CUSUM
  (:mod:`models.counts`) for a storm of ``ecc_rise_ratio`` times the device's
  own quiet rate; the statistic over ``ecc_threshold`` is over. The quiet rate
  starts from a prior (``ecc_prior_events`` in ``ecc_prior_s``) and learns the
  device's quiet intervals.
- ``thermal``: temperature against power, through a per-accelerator-type
  online regression ``T ~ a + b * P`` (inlet and cooling show up as the
  residual), the residual smoothed per device and compared with the cohort's
  residual spread; thermal clock-event reasons count as over.
- ``tpot_vs_peers``: log TPOT (p50, scaled by the device's clock ratio) against
  its cohort, model x accelerator type x region x load band (the batch it
  ran, in bands of 25%; a region's serving stack is rolled out on its own),
  smoothed per device and net of the device's own long-run offset from its
  peers (its history), so a chip that always ran 3% slow is
  not news and one that became 15% slow is. A band's peers are its samples of
  the last ``tpot_peer_age_s``: traffic leaves and re-enters bands, and a band
  left before a rollout would otherwise judge the first device back in it by
  the TPOT of before. Its peers are the devices that taught it within the last
  ``tpot_peer_fresh_s`` (the time a device is held over before it is dying),
  counted when a reading is judged, not when its sample came: a cohort whose
  other devices stopped teaching it (capped, drained, slow themselves) is a
  record of the past. A device whose newest sample's band cannot score it has
  no TPOT reading: the excess it had in its band of before is not now's.
  (Probes and temperature are per accelerator type, which every device of the
  type feeds all the time: their windows are counts only.)
- ``probe_vs_peers``: GEMM probe throughput (over the clock ratio) against the
  accelerator type's probes, two slow probes in a row. The newest probe's gap is
  taken against the peers as they read now, not as they read when it came in:
  a round of probes reaches the detector one node at a time, and a rollout that
  moves the reference part way through a round would otherwise leave the nodes
  read first looking slower than the rest.

A device whose clocks a power cap or brake holds down (DCGM's clock-event
reasons) is slow by the power controller's hand: its TPOT is neither judged nor
learned from until the cap is lifted. Its probes are judged over its clock
ratio (GEMM throughput follows the SM clock) once its clocks have held steady
for ``clock_settle_s``, against uncapped peers; they are not learned from.
- ``xid_rise``: non-fatal XIDs, a Poisson CUSUM (:mod:`models.counts`, as for
  correctable ECC) for a flap of one XID every ``xid_flap_every_s`` against a
  fixed quiet rate: two XIDs close together or three spread over minutes cross
  it, where a count in a fixed window missed both (four XIDs over seven minutes
  never three within five; two three seconds apart). Quiet time drains it, and
  it reads over only while XIDs keep coming (the newest within
  ``xid_flap_every_s``), so a device that stopped flapping is not stepped
  further on what it did minutes ago.

Per-device state is a slotted record of a few dozen numbers (well under
2 KiB pickled; a test measures it); the river models live per cohort.

Example::

    detector = HealthDetector(HealthConfig())
    for verdict in detector.accelerator(sample):
        publish(verdict)
    detector.tick(newest_event_time)   # heartbeat timeouts
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Collection, Hashable
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from models.attribution import GROUPS_OF, HEATING, CommonMode, GroupJudgement, Shared
from models.cohort import Cohorts
from models.counts import RiseState
from models.evidence import next_slot, phase, streak
from models.health_state import (
    DeviceState,
    EwRegression,
    HealthConfig,
    Reading,
    counted,
    describe,
    finite,
    over_threshold,
    sequential,
)
from schemas.base import AcceleratorType, pool_name
from schemas.dcgm import CLOCKS_HW_POWER_BRAKE, CLOCKS_SW_POWER_CAP, CLOCKS_THERMAL, FATAL_XIDS
from schemas.envelopes import AcceleratorSample, AnyAcceleratorSample, AnyServingSample
from schemas.events import AcceleratorTelemetry, NodeHealth, ProbeKind
from schemas.verdicts import HARD_CONFIRMED, SILENCE_SIGNALS, HealthStatus, Level, Verdict

LOST, QUIET = SILENCE_SIGNALS

POWER_HELD = CLOCKS_SW_POWER_CAP | CLOCKS_HW_POWER_BRAKE  # clocks held down by our hand

LOAD_BAND_BASE = math.log(1.25)
__all__ = ["DeviceState", "HealthConfig", "HealthDetector"]


class HealthDetector:
    """Turns each device's telemetry, its node's health and its peers' serving figures
    into verdicts on each device's health. ``new_id`` makes verdict ids (seeded in
    tests)."""

    def __init__(
        self, config: HealthConfig | None = None, *, new_id: Callable[[], UUID] = uuid.uuid4
    ) -> None:
        self.config = config or HealthConfig()
        self.ecc_rise = self.config.ecc_rise()
        self.xid_rise = self.config.xid_rise()
        self.new_id = new_id
        self.devices: dict[str, DeviceState] = {}
        self.node_devices: dict[str, list[str]] = {}  # node -> its devices, as first seen
        self.nodes: dict[str, float] = {}  # node -> newest heartbeat (epoch s)
        self.node_seen: dict[str, float] = {}  # node -> its newest heartbeat's own time
        self.nodes_wall: dict[str, float] = {}  # node -> when it arrived (processing time)
        self.node_source: dict[str, Hashable] = {}
        self.watermarks: dict[Hashable, float] = {}  # source -> newest event time read from it
        self.lost_nodes: set[str] = set()
        self.future_dated = 0  # samples dated past broker time + max_skew_s (clamped)
        self.tpot_peers = Cohorts(
            window=256,
            min_samples=40,
            sigma_floor=0.01,
            max_age_s=self.config.tpot_peer_age_s,
            fresh_s=self.config.tpot_peer_fresh_s,
        )
        self.probe_peers = Cohorts(window=128, min_samples=16, sigma_floor=0.01)
        self.thermal_peers = Cohorts(window=512, min_samples=60, sigma_floor=1.0)
        self.thermal_fit: dict[AcceleratorType, EwRegression] = {}
        c = self.config
        floors = {
            "thermal_resid_celsius": c.thermal_margin_celsius,
            "tpot_vs_peers_log": math.log1p(c.tpot_margin_ratio),
            "probe_gap": c.probe_margin_ratio,
            "xid_rise": c.xid_threshold,
        }
        self.common = CommonMode(
            self._reading_of, floors, sustain_s=c.sustain_s, verdict_interval_s=c.verdict_interval_s
        )

    def _place(self, device_uuid: str, device: DeviceState) -> None:
        """Its groups: what a deviation it shares may belong to (:mod:`models.attribution`)."""
        self.common.place(device_uuid, "node", device.node_id)
        self.common.place(device_uuid, "rack", device.rack_id)
        self.common.place(device_uuid, "type", f"{device.kind.value}@{device.region}")
        if device.model:
            self._place_model(device_uuid, device)

    def _place_model(self, device_uuid: str, device: DeviceState) -> None:
        self.common.place(device_uuid, "model", f"{device.model}@{device.region}")
        stack = f"{device.model}/{device.kind.value}@{device.region}"
        self.common.place(device_uuid, "stack", stack)

    def adopt(self, device_uuid: str, device: DeviceState) -> bool:
        """Take up a device's record a previous process kept (:mod:`models.health_memory`),
        unless this one has newer samples of it; returns whether it was taken."""
        known = self.devices.get(device_uuid)
        if known is not None and known.live_s >= device.live_s:
            return False
        self.devices[device_uuid] = device
        members = self.node_devices.setdefault(device.node_id, [])
        if device_uuid not in members:
            members.append(device_uuid)
        self._place(device_uuid, device)
        return True

    def release(self, owned: Callable[[Hashable], bool]) -> int:
        """Forget every device and node whose samples come from a source that is no longer
        ``owned`` (a partition another process took): its new owner judges it now, and a
        source that stops here must not look like a fleet gone silent. Returns how many
        devices were let go."""
        gone = [u for u, d in self.devices.items() if d.source is not None and not owned(d.source)]
        for device_uuid in gone:
            del self.devices[device_uuid]
        self.common.forget(gone)
        nodes = [n for n, s in self.node_source.items() if not owned(s)]
        nodes += [n for n, members in self.node_devices.items() if set(members) <= set(gone)]
        for node in set(nodes):
            tables = (self.nodes, self.nodes_wall, self.node_source, self.node_devices,
                      self.node_seen)  # fmt: skip
            for table in tables:
                table.pop(node, None)
            self.lost_nodes.discard(node)
        for source in [s for s in self.watermarks if not owned(s)]:
            del self.watermarks[source]
        return len(gone)

    # -- inputs ---------------------------------------------------------------------------

    def observe(
        self,
        event: AnyAcceleratorSample | NodeHealth | AnyServingSample,
        *,
        appended_at: datetime | None = None,
        received_s: float | None = None,
        source: Hashable = None,
    ) -> list[Verdict]:
        """Any of the three families the detector reads, to its own step."""
        kw: dict[str, Any] = {
            "appended_at": appended_at, "received_s": received_s, "source": source
        }  # fmt: skip
        if isinstance(event, AcceleratorTelemetry | AcceleratorSample):
            return self.accelerator(event, **kw)
        if isinstance(event, NodeHealth):
            return self.heartbeat(event, **kw)
        return self.serving(event, **kw)

    def accelerator(
        self,
        sample: AnyAcceleratorSample,
        *,
        appended_at: datetime | None = None,
        received_s: float | None = None,
        source: Hashable = None,
    ) -> list[Verdict]:
        c = self.config
        t, broker = self._times(sample.observed_at, appended_at)
        self._advance(source, broker)
        d = self.devices.get(sample.device_uuid)
        if d is None:
            d = self.devices[sample.device_uuid] = DeviceState(
                sample.node_id, sample.region, sample.rack_id, sample.accelerator_type
            )
            self.node_devices.setdefault(sample.node_id, []).append(sample.device_uuid)
            self._place(sample.device_uuid, d)
        # a copy (a producer's retry) or a sample older than the last (a lagging partition,
        # a skewed clock) says nothing new of rates and trends: only its hard evidence counts
        fresh = t > d.seen_s
        dt = t - d.seen_s
        if fresh:
            d.seen_s = t
        d.live_s, d.source = max(d.live_s, broker), source
        if sample.sm_clock_mhz is not None and sample.sm_clock_mhz > 0:
            d.clock_max_mhz = max(d.clock_max_mhz, sample.sm_clock_mhz)
            ratio = sample.sm_clock_mhz / d.clock_max_mhz
            if abs(ratio - d.clock_ratio) > c.clock_settle_ratio * d.clock_ratio:
                d.clock_moved_s = t
            d.clock_ratio = ratio
        d.capped = bool((sample.clock_throttle_reasons or 0) & POWER_HELD)
        d.dbe = sample.ecc_dbe_volatile_total or 0
        if sample.xid_last and sample.xid_last in FATAL_XIDS:
            d.fatal_xid, d.fatal_at_s = sample.xid_last, t
        # this sample's own word, not a latch an earlier sample set: a double-bit count (a
        # counter: every later sample repeats it), or a fatal XID raised in its interval
        own = d.dbe > 0 or (sample.xid_last or 0) in FATAL_XIDS
        d.hard_seen, d.hard_at_s = _confirmed(d.hard_seen, d.hard_at_s, own, broker, c)
        if fresh:
            if sample.ecc_sbe_volatile_total is not None:
                self._ecc(d, sample.ecc_sbe_volatile_total, t)
            if sample.xid_last and sample.xid_last not in FATAL_XIDS:
                rise = self.xid_rise  # drained for the quiet time, then the XID added
                statistic = self._xid_statistic(d, t) + math.log(rise.ratio)
                d.xid_cusum, d.xid_at_s = min(statistic, rise.cap_ratio * rise.threshold), t
            self._thermal(d, sample, t, dt)
        return self._judge(sample.device_uuid, d, t, sample.event_id, appended_at)

    def serving(
        self,
        metrics: AnyServingSample,
        *,
        appended_at: datetime | None = None,
        received_s: float | None = None,
        source: Hashable = None,
    ) -> list[Verdict]:
        del received_s, source  # latency is judged against peers, not against time
        device = metrics.device_uuid or ""
        d = self.devices.get(device)
        if (
            d is None
            or metrics.tpot_p50_s is None
            or metrics.tpot_p50_s <= 0
            or metrics.requests == 0
        ):
            return []
        c = self.config
        t, _ = self._times(metrics.observed_at, appended_at)
        if t <= d.served_s:  # a copy, or older than what it judged: nothing new
            return []
        d.served_s = t
        if metrics.model != d.model:
            d.model = metrics.model
            self._place_model(device, d)
        if t - d.tpot_seen_s > c.tpot_stale_s:
            # back from a drain (or a long idle): judge it afresh, on what it does from now
            d.tpot_n, d.tpot_fast = 0, 0.0
            d.since.pop("tpot_vs_peers_log", None)
        # the load band is the batch the replica ran: TPOT normalised for batch size, from the
        # same sample (a smoothed request rate lags a shift of traffic and fakes slowness)
        if d.capped:  # slower by our own hand (a power cap): neither judged nor learned from
            return self._judge(device, d, t, metrics.event_id, appended_at)
        d.tpot_band = round(math.log(max(metrics.batch_size, 1)) / LOAD_BAND_BASE)
        key = self._tpot_cohort(d)
        x = math.log(metrics.tpot_p50_s * d.clock_ratio)
        peer = self.tpot_peers.score(key, x, device, at_s=t)  # score first, then learn
        over = False
        if peer is None:  # a band too few peers ran lately: its excess of before is not now's
            d.since.pop("tpot_vs_peers_log", None)
        else:
            dev = peer.deviation
            d.tpot_fast = dev if d.tpot_n == 0 else d.tpot_fast + c.fast_alpha * (dev - d.tpot_fast)
            d.tpot_n += 1
            d.tpot_sigma = peer.sigma
            d.tpot_seen_s = t
            warm = d.tpot_n > c.warmup_samples
            over = warm and self._tpot_excess(d) > self._tpot_threshold(d)
            if not over:  # the device's own history learns only what looks normal
                a = max(c.history_alpha, 1.0 / d.tpot_n)
                limit = math.log1p(c.history_max_ratio)
                d.tpot_history += a * (d.tpot_fast - d.tpot_history)
                d.tpot_history = min(max(d.tpot_history, -limit), limit)
        # the cohort learns what is normal for it now: not a device's own slowness, but a
        # slowness its groups share (a rollout on its type or model) is the cohort's
        if not over or self._shared(device, d, "tpot_vs_peers_log", t):
            self.tpot_peers.learn(key, x, device, at_s=t)
        return self._judge(device, d, t, metrics.event_id, appended_at)

    def heartbeat(
        self,
        health: NodeHealth,
        *,
        appended_at: datetime | None = None,
        received_s: float | None = None,
        source: Hashable = None,
    ) -> list[Verdict]:
        t, broker = self._times(health.observed_at, appended_at)
        self._advance(source, broker)
        fresh = t > self.node_seen.get(health.node_id, -math.inf)
        if fresh:  # a copy or an older heartbeat: alive, but its probes were counted already
            self.node_seen[health.node_id] = t
        self.nodes[health.node_id] = max(self.nodes.get(health.node_id, broker), broker)
        self.node_source[health.node_id] = source
        if received_s is not None:
            self.nodes_wall[health.node_id] = received_s
        out: list[Verdict] = []
        if health.node_id in self.lost_nodes:
            self.lost_nodes.discard(health.node_id)
        touched: set[str] = set()
        for p in health.probes if fresh else ():
            d = self.devices.get(p.device_uuid or "")
            if d is None or p.probe is not ProbeKind.GEMM:
                continue
            touched.add(p.device_uuid or "")
            d.probe_failed = not p.passed
            d.probe_fails, d.probe_failed_at_s = _confirmed(
                d.probe_fails, d.probe_failed_at_s, d.probe_failed, broker, self.config
            )
            if p.expected_ratio is None or not p.passed:
                continue
            settled = t - d.clock_moved_s >= self.config.clock_settle_s
            if d.capped and not settled:
                continue  # its clocks are moving under a cap: which clock did the probe run at?
            x = p.expected_ratio / max(d.clock_ratio, 0.05)
            before = self._probe_streak(d, t)  # a streak the peers have since caught up with ends
            d.probe_x = x
            slow = self._probe_gap(d, t)[1]
            d.probe_slow = before + 1 if slow else 0
            if not d.capped and (not slow or self._shared(p.device_uuid or "", d, "probe_slow", t)):
                self.probe_peers.learn(d.kind, x, p.device_uuid, at_s=t)  # peers: uncapped devices
        for device_uuid in self.node_devices.get(health.node_id, ()):
            d = self.devices[device_uuid]
            out.extend(self._judge(device_uuid, d, t, health.event_id, appended_at))
        return out

    def tick(
        self, now: datetime, *, wall_s: float = math.inf, drained: Collection[Hashable] = ()
    ) -> list[Verdict]:
        """Time passed: heartbeat losses. ``now`` is event time, ``wall_s`` processing time
        (the clock ``received_s`` came from); ``drained``: sources the broker says were
        read to their end (:meth:`unwitnessed` names the ones worth asking about)."""
        t = now.timestamp()
        silent = {n for n, seen in self.nodes.items() if self._behind(n, seen)}
        quiet = {
            n
            for n, seen in self.nodes.items()
            if n not in silent and self._quiet(n, seen, t, wall_s, drained)
        }
        if len(quiet) <= self.config.blind_ratio * len(self.nodes):
            silent |= quiet  # else whole sources went quiet at once: we are blind; stay static
        newly = silent - self.lost_nodes
        self.lost_nodes = silent
        out: list[Verdict] = []
        for node in sorted(newly):
            for device_uuid in self.node_devices.get(node, ()):
                out.extend(self._judge(device_uuid, self.devices[device_uuid], t, None, None))
        out.extend(self._group_verdict(j, t) for j in self.common.judge(t))
        return out

    def _times(self, observed_at: datetime, appended_at: datetime | None) -> tuple[float, float]:
        """(event time, broker time) of a sample, epoch seconds. Broker time is when it
        reached the broker (its log-append timestamp), or its own time when not known (a
        replay in process). Event time is the sample's own clock, clamped to at most
        ``max_skew_s`` past broker time and counted in :attr:`future_dated`: a clock that
        runs ahead (or a forged date) never moves the detector's time."""
        t = observed_at.timestamp()
        if appended_at is None:
            return t, t
        broker = appended_at.timestamp()
        if t > broker + self.config.max_skew_s:
            self.future_dated += 1
            return broker + self.config.max_skew_s, broker
        return t, broker

    def _advance(self, source: Hashable, at_s: float) -> None:
        if at_s > self.watermarks.get(source, -math.inf):
            self.watermarks[source] = at_s

    def _behind(self, node: str, seen: float) -> bool:
        """Silent against its own source's progress: its partition-mates heartbeat on, so
        no consumer lag or skew between partitions can fake it."""
        mark = self.watermarks.get(self.node_source.get(node), seen)
        return mark - seen > self.config.heartbeat_timeout_s

    def _quiet(
        self, node: str, seen: float, now: float, wall_s: float, drained: Collection[Hashable]
    ) -> bool:
        """Its whole source went quiet (no partition-mate to witness it, or none left): silent
        once the broker says the source was read to its end (nothing appended there is
        unread: no consumer stall can fake it), or else after ``stall_wall_s`` of processing
        time without a word; a node found so stays silent until it speaks. Never when most
        of the fleet went quiet together."""
        c = self.config
        if now - seen <= c.heartbeat_timeout_s:
            return False
        if node in self.lost_nodes or self.node_source.get(node) in drained:
            return True
        arrived = self.nodes_wall.get(node)
        quiet_wall = wall_s - arrived if arrived is not None else math.inf
        return quiet_wall > c.stall_wall_s

    def unwitnessed(self, now: datetime) -> set[Hashable]:
        """Sources of nodes silent past ``heartbeat_timeout_s`` of ``now`` that no
        partition-mate shows to be behind, not yet lost: whether their partitions were read
        to the end is the broker's to say (``drained`` of :meth:`tick`)."""
        t = now.timestamp()
        return {
            self.node_source[n]
            for n, seen in self.nodes.items()
            if n not in self.lost_nodes
            and n in self.node_source
            and t - seen > self.config.heartbeat_timeout_s
            and not self._behind(n, seen)
        }

    # -- signals --------------------------------------------------------------------------

    def _ecc(self, device: DeviceState, total: int, at_s: float) -> None:
        rise = self.ecc_rise
        if device.sbe_last < 0 or total < device.sbe_last:  # first sample, or counters were reset
            device.sbe_last, device.sbe_at_s, device.ecc_cusum = total, at_s, 0.0
            return
        events, elapsed = total - device.sbe_last, at_s - device.sbe_at_s
        device.sbe_last, device.sbe_at_s = total, at_s
        state = RiseState(device.ecc_cusum, device.ecc_quiet_events, device.ecc_quiet_s)
        device.ecc_cusum, device.ecc_quiet_events, device.ecc_quiet_s = rise.update(
            state, events, elapsed
        )

    def _xid_statistic(self, device: DeviceState, at_s: float) -> float:
        """The XID flap statistic at ``at_s``: as of its newest XID, less the quiet time
        since (the drain is linear down to 0, so it is taken when read, not every sample)."""
        if device.xid_at_s == -math.inf:
            return 0.0
        quiet = max(0.0, at_s - device.xid_at_s)
        return self.xid_rise.step(device.xid_cusum, 0, quiet, self.config.xid_quiet_per_s())

    def _xid_reading(self, device: DeviceState, at_s: float) -> float:
        """The flap statistic while XIDs keep coming, 0 once the newest is older than
        ``xid_flap_every_s``: the statistic drains over many minutes (it remembers a flap,
        so a device that starts again is over at its next XID), and a device whose XIDs
        stopped must not be stepped down the ladder on them meanwhile."""
        if at_s - device.xid_at_s > self.config.xid_flap_every_s:
            return 0.0
        return self._xid_statistic(device, at_s)

    def _thermal(
        self, device: DeviceState, sample: AnyAcceleratorSample, at_s: float, dt: float
    ) -> None:
        c = self.config
        device.thermal_hot = bool((sample.clock_throttle_reasons or 0) & CLOCKS_THERMAL)
        if sample.gpu_temp_celsius is None or sample.power_usage_watts is None:
            return
        # the die lags the power it draws: compare temperature with power smoothed the same way
        if math.isnan(device.power_smooth) or not 0 < dt < 10 * c.thermal_tau_s:
            device.power_smooth = sample.power_usage_watts
        else:
            device.power_smooth += (1 - math.exp(-dt / c.thermal_tau_s)) * (
                sample.power_usage_watts - device.power_smooth
            )
        power = device.power_smooth
        fit = self.thermal_fit.setdefault(device.kind, EwRegression())
        r = fit.residual(power, sample.gpu_temp_celsius)
        hot = device.thermal_hot
        peer = (
            None
            if r is None
            else self.thermal_peers.score(device.kind, r, sample.device_uuid, at_s=at_s)
        )
        if peer is not None:
            device.temp_resid += c.fast_alpha * (peer.deviation - device.temp_resid)
            device.thermal_sigma = peer.sigma
            hot = hot or device.temp_resid > self._thermal_threshold(device)
        if hot:
            return  # neither the fit nor the cohort learns from a hot device
        if r is not None:
            self.thermal_peers.learn(device.kind, r, sample.device_uuid, at_s=at_s)
        fit.learn(power, sample.gpu_temp_celsius)

    def _tpot_current(self, device_uuid: str, device: DeviceState, at_s: float) -> bool:
        """Whether ``device`` has a TPOT reading to judge now: warm, not slowed by our own hand
        (a cap), scored not ``tpot_stale_s`` ago, and its newest sample's cohort able to
        score it now, with peers fresh now (``tpot_peer_fresh_s``). A batch band few peers
        ran lately cannot say, and the excess a device had in its band of before is not
        now's: a few seconds into a rollout, before the old band's reference caught up, the
        load moving to a band no peer ran would hold the device at that excess. And a score
        is only as good as its peers are when it is judged: the peers that taught the cohort
        when the sample came may have stopped since (capped, drained, slow themselves)."""
        c = self.config
        return (
            not device.capped
            and at_s - device.tpot_seen_s <= c.tpot_stale_s
            and device.tpot_n > c.warmup_samples
            and self.tpot_peers.ready(self._tpot_cohort(device), device_uuid, at_s=at_s)
        )

    @staticmethod
    def _tpot_cohort(device: DeviceState) -> Hashable:
        """The TPOT cohort of ``device``'s newest sample."""
        return (device.model, device.kind, device.region, device.tpot_band)

    def _tpot_excess(self, device: DeviceState) -> float:
        return device.tpot_fast - device.tpot_history

    def _tpot_threshold(self, device: DeviceState) -> float:
        c = self.config
        return max(math.log1p(c.tpot_margin_ratio), c.peer_z * device.tpot_sigma)

    def _thermal_threshold(self, device: DeviceState) -> float:
        c = self.config
        return max(c.thermal_margin_celsius, c.peer_z * device.thermal_sigma)

    # -- judgement ------------------------------------------------------------------------

    def _probe_gap(self, device: DeviceState, at_s: float) -> tuple[float, bool]:
        """(how far its newest probe sits below its type's peers, whether that is slow), taken
        against the peers as they read now, not as they read when the probe came in: the
        probes of one round reach the detector one node at a time, and when a rollout moves
        the peers' reference in the middle of a round, a gap taken at arrival would depend on
        which node was read first (the first read slow, the last did not)."""
        c = self.config
        peer = self.probe_peers.score(device.kind, device.probe_x, at_s=at_s)
        if peer is None:
            return 0.0, False
        gap = -peer.deviation
        return gap, gap > max(c.probe_margin_ratio, c.peer_z * peer.sigma)

    def _probe_streak(self, device: DeviceState, at_s: float) -> int:
        """Its slow probes in a row, while the newest is still slow against its peers now."""
        if device.probe_slow and self._probe_gap(device, at_s)[1]:
            return device.probe_slow
        return 0

    def _soft(
        self, device_uuid: str, device: DeviceState, name: str, at_s: float
    ) -> Reading | None:
        """One of the soft signals a group may share, as ``device`` reads now (None: it has
        no current reading of it)."""
        c = self.config
        if name == HEATING:  # what its type's fit says its power heats it by
            fit = self.thermal_fit.get(device.kind)
            slope = None if fit is None else fit.slope
            if slope is None or math.isnan(device.power_smooth):
                return None
            return Reading(name=name, value=slope * device.power_smooth, threshold=0)
        if name == "thermal_resid_celsius":
            value, threshold = device.temp_resid, self._thermal_threshold(device)
            if device.thermal_hot:
                value = max(value, threshold)
            return Reading(name=name, value=value, threshold=threshold)
        if name == "tpot_vs_peers_log":
            if not self._tpot_current(device_uuid, device, at_s):
                return None
            return Reading(name, self._tpot_excess(device), self._tpot_threshold(device))
        if name == "probe_slow":
            return Reading(name=name, value=self._probe_streak(device, at_s), threshold=2)
        if name == "probe_gap":  # what a slow probe is slow by (the group's measure)
            gap = self._probe_gap(device, at_s)[0]
            return Reading(name=name, value=gap, threshold=c.probe_margin_ratio)
        xids = self._xid_reading(device, at_s)
        return Reading(name=name, value=xids, threshold=c.xid_threshold)

    def _shared(self, device_uuid: str, device: DeviceState, name: str, at_s: float) -> bool:
        """Whether ``device``'s ``name``, over its threshold, is a deviation its groups share."""
        if not self.config.common_mode:
            return False
        reading = self._soft(device_uuid, device, name, at_s)
        return reading is not None and self.common.explain(device_uuid, reading, at_s) is not None

    def _reading_of(self, device_uuid: str, name: str, at_s: float) -> Reading | None:
        """A group member's current reading of ``name`` (none from a device gone quiet)."""
        device = self.devices.get(device_uuid)
        if device is None or at_s - device.seen_s > self.config.tpot_stale_s:
            return None
        if device.status is HealthStatus.FAILED:
            return None  # a failed device's readings say nothing about its group
        return self._soft(device_uuid, device, name, at_s)

    def signals(
        self, device_uuid: str, device: DeviceState, at_s: float
    ) -> tuple[list[Reading], list[Reading]]:
        """(hard signals firing, soft signals evaluated), each as value against threshold:
        plain readings, made into verdict signals only when a verdict is emitted."""
        c = self.config
        hard: list[Reading] = []
        if device.dbe > 0:
            hard.append(Reading(name="ecc_dbe", value=device.dbe, threshold=1))
        if device.fatal_xid and at_s - device.fatal_at_s <= c.fatal_latch_s:
            hard.append(
                Reading(name=f"xid_{device.fatal_xid}", value=device.fatal_xid, threshold=0)
            )
        if device.probe_failed:
            hard.append(Reading(name="probe_failed", value=1, threshold=1))
        if hard:  # evidence of the device's own: one sample says it, two confirm it
            seen = max(device.hard_seen, device.probe_fails)
            hard.append(Reading(name=HARD_CONFIRMED, value=seen, threshold=2))
        # silence, judged on broker time, follows; it is never confirmed evidence
        if device.node_id in self.lost_nodes:
            age = max(0.0, at_s - self.nodes.get(device.node_id, at_s))
            hard.append(Reading(name=LOST, value=age, threshold=c.heartbeat_timeout_s))
        elif (
            gap := self.watermarks.get(device.source, device.live_s) - device.live_s
        ) > c.heartbeat_timeout_s:
            # its partition-mates report on, it does not: a device off the bus
            hard.append(Reading(name=QUIET, value=gap, threshold=c.heartbeat_timeout_s))
        soft: list[Reading] = []
        soft.append(Reading("ecc_sbe_rise", device.ecc_cusum, c.ecc_threshold))
        # inline, every sample: the same readings as _soft (a test holds them equal)
        thermal = device.temp_resid
        threshold = self._thermal_threshold(device)
        if device.thermal_hot:
            thermal = max(thermal, threshold)
        soft.append(Reading("thermal_resid_celsius", thermal, threshold))
        if self._tpot_current(device_uuid, device, at_s):
            excess, limit = self._tpot_excess(device), self._tpot_threshold(device)
            soft.append(Reading("tpot_vs_peers_log", excess, limit))
        soft.append(Reading("probe_slow", self._probe_streak(device, at_s), 2))
        soft.append(Reading("xid_rise", self._xid_reading(device, at_s), c.xid_threshold))
        return hard, soft

    def _judge(
        self,
        device_uuid: str,
        device: DeviceState,
        at_s: float,
        cause: UUID | None,
        appended_at: datetime | None,
    ) -> list[Verdict]:
        c = self.config
        hard, soft = self.signals(device_uuid, device, at_s)
        silent_s = self._silent_since(device, hard)
        if silent_s is not None:  # its time and cause are the silence's, not the event's
            at_s, cause = max(at_s, silent_s), None
            appended_at = datetime.fromtimestamp(silent_s, UTC)
        over = []
        shared: list[tuple[Reading, Shared]] = []
        for s in soft:
            if over_threshold(s):
                group = (
                    self.common.explain(device_uuid, s, at_s)
                    if c.common_mode and s.name in GROUPS_OF
                    else None
                )
                if group is None:  # else its group's, not its own (models.attribution)
                    over.append(s)
                else:
                    shared.append((s, group))
        # a signal under its threshold, shared, or with no reading now is over no longer
        held = streak(device.since, [s.name for s in over], at_s)
        sustained = [
            s
            for s in over
            if (
                s.value >= s.threshold
                if counted(s.name) or sequential(s.name)
                else held[s.name] >= c.sustain_s
            )
        ]
        if hard:
            status, score = HealthStatus.FAILED, 1.0
        elif sustained:
            status, score = HealthStatus.DYING, 0.75
        elif over:
            status, score = HealthStatus.SUSPECT, 0.5
        else:
            status, score = HealthStatus.HEALTHY, 0.0
        confirmed = status is HealthStatus.FAILED and max(device.hard_seen, device.probe_fails) >= 2
        if (
            status is device.status
            and confirmed is device.confirmed_emitted
            and at_s < device.keepalive_s
        ):
            return []  # most samples end here: what follows is for a verdict that goes out
        if status is HealthStatus.HEALTHY:
            score = max((0.5 * s.value / s.threshold for s in soft if s.threshold > 0), default=0)
        score = min(max(score, 0.0), 1.0)
        previous, device.status = device.status, status
        interval = c.verdict_interval_s
        offset = phase(device_uuid, c.keepalive_slots) * interval  # its slot of the interval
        device.keepalive_s = next_slot(at_s, interval, offset)
        device.confirmed_emitted = confirmed
        shown = (hard + over) or soft
        evidence = "; ".join(describe(s, at_s - device.since.get(s.name, at_s)) for s in shown)
        if shared:
            attribution = "; ".join(group.describe(s) for s, group in shared)
        elif over:
            attribution = "its own: beyond its node and cohorts"
        else:
            attribution = ""
        return [
            Verdict(
                verdict_id=self.new_id(),
                observed_at=datetime.fromtimestamp(at_s, UTC),
                device_uuid=device_uuid,
                node_id=device.node_id,
                region=device.region,
                rack_id=device.rack_id,
                pool=pool_name(device.region, device.kind),
                accelerator_type=device.kind,
                status=status,
                previous_status=previous,
                score=round(score, 4),
                evidence=evidence[:1024],
                signals=tuple(finite(s) for s in (hard + soft)[:12]),
                cause_event_id=cause,
                cause_appended_at=appended_at,
                attribution=attribution[:1024],
            )
        ]

    def _silent_since(self, device: DeviceState, hard: list[Reading]) -> float | None:
        """When silence became the only hard evidence on the broker's clock: the device's (or
        its node's) last word plus ``heartbeat_timeout_s``; ``None`` where it is not the only
        evidence. Whatever event the verdict is judged on (a heartbeat read after the
        telemetry partition moved on, a tick), the verdict is no older than the silence it
        reports, and the silence, not that event, is its cause."""
        names = {r.name for r in hard}
        if not names or not names <= set(SILENCE_SIGNALS):
            return None
        last = self.nodes.get(device.node_id, device.live_s) if LOST in names else device.live_s
        return last + self.config.heartbeat_timeout_s

    def _group_verdict(self, judged: GroupJudgement, at_s: float) -> Verdict:
        """A group's verdict: the group in ``device_uuid`` and ``scope``, its medians as
        signals. Where the group spans more than one of a field (a rack's types, a cohort's
        nodes), the field says ``*``."""
        key = judged.key
        members = [self.devices[u] for u in self.common.members.get(key, ()) if u in self.devices]
        first = members[0] if members else None

        def one(values: set[str]) -> str:
            return values.pop() if len(values) == 1 else "*"

        kinds = {m.kind for m in members}
        kind = first.kind if first is not None else AcceleratorType.H100
        region = one({m.region for m in members})
        signals = tuple(
            finite(Reading(name, g.median, self.common.floors[name]))
            for name, g in judged.readings.items()
        )
        held = ", ".join(f"{name} for {for_s:.0f}s" for name, for_s in judged.over.items())
        over = {n: g for n, g in judged.readings.items() if n in judged.over}
        shares = "; ".join(
            f"{n} median {g.median:.3g} ({g.over_share:.0%} of {g.members} over)"
            for n, g in over.items()
        )
        why = {
            Level.NODE: "a node's own cause (its cooling, inlet air, host or power)",
            Level.RACK: "the rack's air or power",
            Level.COHORT: "a cause shared by the cohort (a rollout, a driver, its demand)",
        }[key.level]
        attribution = (
            f"{shares}: shared by its devices, attributed to {key.kind} {key.scope}, {why}"
            if over
            else f"{key.kind} {key.scope}: its devices no longer deviate together"
        )
        score = {HealthStatus.DYING: 0.75, HealthStatus.SUSPECT: 0.5}.get(judged.status, 0.0)
        return Verdict(
            verdict_id=self.new_id(),
            observed_at=datetime.fromtimestamp(at_s, UTC),
            device_uuid=key.scope,
            node_id=key.scope if key.kind == "node" else one({m.node_id for m in members}),
            region=region,
            rack_id=one({m.rack_id for m in members}),
            pool=pool_name(region, kind) if region != "*" and len(kinds) == 1 else "*",
            accelerator_type=kind,
            status=judged.status,
            previous_status=judged.previous,
            score=score,
            evidence=(f"group over: {held}" if held else "group within its floors")[:1024],
            signals=signals[:12],
            level=key.level,
            scope=key.scope,
            attribution=attribution[:1024],
            members=judged.members,
        )


def _confirmed(
    count: int, at_s: float, present: bool, broker_s: float, config: HealthConfig
) -> tuple[int, float]:
    """Samples in a row (at least ``confirm_gap_s`` apart in broker time) that carried a
    piece of hard evidence, and when the last did: two confirm it, one never can."""
    if not present:
        return 0, at_s
    if count == 0 or broker_s - at_s >= config.confirm_gap_s:
        return count + 1, broker_s
    return count, at_s
