"""Who may use the worker's pages.

Every page but ``/metrics`` and ``/healthz`` (scraped by Prometheus and probed by
orchestrators, by any name) answers only when the request's ``Host`` is one of
this worker's names: a page reached through some other name was reached by DNS
rebinding, from a browser that believes it is talking to another site.

``/sql`` and every page that changes something (``POST /guardrail/reset``) also
need, in this order:

- no ``Origin`` other than the page's own (a cross-origin browser request);
- ``Content-Type: application/json`` (a browser sends a form or ``text/plain``
  cross-origin without asking first; JSON it must ask for, and nobody answers);
- ``Authorization: Bearer <token>``, compared in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
NO_ACCESS = (503, "this worker was started without a page token: its guarded pages are off")
ANY_ADDRESS = frozenset({"", "0.0.0.0", "::"})


def hostname(host_header: str) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:6066`` -> ``::1``)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


@dataclass(frozen=True, slots=True)
class PageAccess:
    token: str
    hosts: frozenset[str]

    @classmethod
    def of(cls, token: str, *, bind: str, names: Iterable[str] = ()) -> PageAccess:
        """Access for a worker bound to ``bind``: loopback, the bound address and
        ``names`` (how others reach it: a service name, the machine's name)."""
        if not token:
            raise ValueError("the pages need a token")
        own = {bind.lower()} - ANY_ADDRESS
        return cls(token, LOOPBACK | own | {n.strip().lower() for n in names if n.strip()})

    def host_refusal(self, headers: Mapping[str, str]) -> tuple[int, str] | None:
        """Why a page must not answer a request with these headers, or None."""
        host = hostname(headers.get("Host", ""))
        if host not in self.hosts:
            return 421, f"this worker does not answer to the name {host!r}"
        return None

    def caller_refusal(self, headers: Mapping[str, str]) -> tuple[int, str] | None:
        """Why ``/sql`` or a changing page must not answer, or None."""
        refused = self.host_refusal(headers)
        if refused is not None:
            return refused
        origin = headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc.lower() != headers["Host"].lower():
            return 403, f"cross-origin request from {origin!r}"
        media = headers.get("Content-Type", "").split(";")[0].strip().lower()
        if media != "application/json":
            return 415, "send application/json"
        scheme, _, given = headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), self.token.encode()
        ):
            return 401, "a valid 'Authorization: Bearer <token>' is needed"
        return None


def refusal(
    access: PageAccess | None, headers: Mapping[str, str], *, guarded: bool
) -> tuple[int, str] | None:
    """Why a page must not answer (``guarded``: ``/sql`` or a page that changes
    something), or None; a worker started without access answers no such page."""
    if access is None:
        return NO_ACCESS
    return access.caller_refusal(headers) if guarded else access.host_refusal(headers)
