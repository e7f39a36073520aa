"""Who may use the worker's pages: Host, Origin, media type and token, in that order."""

from __future__ import annotations

import pytest

from streams.page_access import PageAccess, hostname

ACCESS = PageAccess.of("s3cret-token", bind="0.0.0.0", names=("fleetloop-worker",))
GOOD = {
    "Host": "127.0.0.1:6066",
    "Content-Type": "application/json",
    "Authorization": "Bearer s3cret-token",
}


@pytest.mark.parametrize(
    ("header", "name"),
    [("127.0.0.1:6066", "127.0.0.1"), ("[::1]:6066", "::1"), ("::1", "::1"),
     ("Fleetloop-Worker", "fleetloop-worker"), ("localhost", "localhost")],
)  # fmt: skip
def test_hostname_drops_the_port(header: str, name: str) -> None:
    assert hostname(header) == name


def test_the_right_caller_gets_in() -> None:
    assert ACCESS.caller_refusal(GOOD) is None
    assert ACCESS.caller_refusal({**GOOD, "Origin": "http://127.0.0.1:6066"}) is None
    assert ACCESS.caller_refusal({**GOOD, "Host": "fleetloop-worker:6066"}) is None
    assert ACCESS.host_refusal({"Host": "localhost:6066"}) is None


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ({"Host": "attacker.example:6066"}, 421),  # DNS rebinding
        ({"Host": "0.0.0.0:6066"}, 421),  # the wildcard bind is no name
        ({"Host": ""}, 421),
        ({"Origin": "http://attacker.example"}, 403),  # cross-origin
        ({"Content-Type": "text/plain"}, 415),  # a simple cross-origin POST
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
        ({"Authorization": "Bearer s3cret-tokeN"}, 401),
        ({"Authorization": "Basic s3cret-token"}, 401),
        ({"Authorization": ""}, 401),
    ],
)
def test_everyone_else_is_refused_with_a_reason(change: dict[str, str], status: int) -> None:
    refused = ACCESS.caller_refusal({**GOOD, **change})
    assert refused is not None and refused[0] == status and refused[1]


def test_pages_need_a_token() -> None:
    with pytest.raises(ValueError, match="token"):
        PageAccess.of("", bind="127.0.0.1")
