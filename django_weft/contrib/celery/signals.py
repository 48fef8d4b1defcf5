"""Worker-process hooks: give up held runs when a Celery worker process exits."""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_process_shutdown, worker_shutdown

logger = logging.getLogger("django_weft.celery")


@worker_process_shutdown.connect
@worker_shutdown.connect
def release_held_runs(**_kwargs: Any) -> None:
    """A process that stops cleanly releases the runs it still holds (after a warm
    shutdown there are none), so other workers need not wait for the leases to expire."""
    from ...runtime import get_engine
    from ...runtime.heartbeat import stop_heartbeat

    try:
        released = get_engine().release_all()
        if released:
            logger.info("released %d runs at shutdown", len(released))
    except Exception:
        logger.warning("could not release held runs at shutdown; their leases expire", exc_info=True)
    finally:
        stop_heartbeat()
