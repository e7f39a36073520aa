"""The token that guards the worker's pages (``/sql``, ``POST /guardrail/reset``).

Given (``FLEETLOOP_PAGE_TOKEN``), it is used as is. Otherwise the first worker on a
machine makes a random one in ``page_token_file`` (created exclusively, mode 0600)
and every later worker and local CLI reads it there: whoever can read the file may
use the pages, as whoever can read the data directory may read the data.
"""

from __future__ import annotations

import os
import secrets
import time

from fleetloop.settings import ConnectionSettings


def page_token(settings: ConnectionSettings, *, create: bool) -> str | None:
    """The pages' token; None when none is given or kept and ``create`` is false."""
    if settings.page_token is not None:
        return settings.page_token.get_secret_value()
    path = settings.page_token_file
    for _ in range(100):  # another worker may be writing it: it is never empty for long
        try:
            kept = path.read_text().strip()
        except FileNotFoundError:
            break
        if kept:
            return kept
        time.sleep(0.01)
    if not create:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # made meanwhile by another worker: use that one
        return page_token(settings, create=False)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token
