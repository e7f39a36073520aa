"""Settings -> each controller role's wiring: what a worker runs, and what every
evaluation runs, built the same way from the same settings.

A role's wiring is its settings group (the role's tuning) with how it issues
commands: the topic prefix, the signing key (none: advisory, decisions only)
and the commands' lifetime, all from :class:`~fleetloop.settings.WorkerSettings`.
"""

from __future__ import annotations

import logging
from typing import Any

from fleetloop.settings import WorkerSettings
from planning.demand import DemandWiring
from planning.isolation import HealthWiring
from planning.issuing import IssuerWiring, wire
from planning.registry import INGEST, ROLES
from planning.throttle import ControlWiring

log = logging.getLogger(__name__)

WIRINGS: dict[str, type[IssuerWiring]] = {
    "health": HealthWiring,
    "demand": DemandWiring,
    "control": ControlWiring,
}
"""Each controller role's wiring class; its settings group is the field of that name
(tests/unit/test_settings_reach.py checks every role has both)."""


def issuing(settings: WorkerSettings) -> IssuerWiring:
    """How every controller of this worker issues commands."""
    key = settings.signing_key() if settings.command_keys is not None else None
    return IssuerWiring(settings.topic_prefix, key, settings.command_ttl_s)


def role_wiring(settings: WorkerSettings, role: str, how: IssuerWiring | None = None) -> Any:
    """``role``'s wiring from ``settings`` (whether or not this worker runs it); ``how``
    it issues commands when already worked out."""
    return wire(WIRINGS[role], getattr(settings, role), how or issuing(settings))


def health_wiring(settings: WorkerSettings) -> HealthWiring:
    return wire(HealthWiring, settings.health, issuing(settings))


def demand_wiring(settings: WorkerSettings) -> DemandWiring:
    return wire(DemandWiring, settings.demand, issuing(settings))


def control_wiring(settings: WorkerSettings) -> ControlWiring:
    return wire(ControlWiring, settings.control, issuing(settings))


def wirings(settings: WorkerSettings) -> dict[str, IssuerWiring]:
    """The wiring of every controller role this worker runs."""
    how = issuing(settings)  # the keys are parsed once, not per role
    out = {
        role: role_wiring(settings, role, how)
        for role in ROLES
        if role in settings.roles and role != INGEST
    }
    if out and settings.command_keys is None:
        log.warning("no FLEETLOOP_COMMAND_KEYS: the controllers are advisory (decisions only)")
    return out
