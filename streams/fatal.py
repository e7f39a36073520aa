"""How a processor that cannot go on ends its worker."""

from __future__ import annotations

import logging
import os
from typing import NoReturn

log = logging.getLogger(__name__)
EXIT_PROCESSING_FAILED = 70  # EX_SOFTWARE


def fail_stop(processor: str, exc: BaseException) -> NoReturn:
    """End the worker process now; never let a processor continue past a failed batch.

    faust would restart a crashed agent and carry on with later batches, whose
    writes move the sink's watermarks past the failed one, which would then be
    skipped on replay: lost. Exiting keeps the failed batch uncommitted and
    unwritten, so the restarted worker (systemd, compose, Kubernetes) redoes it.
    """
    log.critical("processor %s failed; stopping the worker: %r", processor, exc, exc_info=exc)
    logging.shutdown()
    os._exit(EXIT_PROCESSING_FAILED)


__all__ = ["EXIT_PROCESSING_FAILED", "fail_stop"]
