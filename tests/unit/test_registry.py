"""The controller registry: every decision a planner makes names a registered controller,
and every command it sends was issued by that controller, of its type."""

from __future__ import annotations

from planning.registry import CONTROLLERS, ROLES, controller, controllers_of
from tests.unit.test_control_loop import _run


def test_every_command_is_issued_by_the_controller_that_decided_it() -> None:
    _, outputs = _run(controlled=True, seconds=240, batch_ratio=0.3)
    named = {o.decision.controller for o in outputs}
    assert {"capacity", "power"} <= named, named
    for o in outputs:
        registered = controller(o.decision.controller)
        assert o.decision.reason in registered.reasons
        if o.command is not None:
            assert o.command.issuer == o.decision.controller
            assert isinstance(o.command, registered.command)
            assert o.command.decision_id == o.decision.decision_id


def test_roles_and_names_come_from_one_table() -> None:
    assert ROLES == ("ingest", "health", "demand", "control")
    assert len({c.name for c in CONTROLLERS}) == len(CONTROLLERS)
    assert [c.name for c in controllers_of("control")] == [
        "capacity", "tpot_guard", "power", "power_routing"
    ]  # fmt: skip
    assert controllers_of("ingest") == ()
