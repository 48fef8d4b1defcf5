"""Worker-process hooks: a connection the database closed is dropped before a task uses
it, and held runs are given up when a Celery worker process exits."""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import task_prerun, worker_process_shutdown, worker_shutdown

from ...runtime import outages
from . import ACTIVITY_TASK, GC_TASK, TICK_TASK, TURN_TASK

logger = logging.getLogger("django_weft.celery")

WEFT_TASKS = frozenset({TURN_TASK, ACTIVITY_TASK, TICK_TASK, GC_TASK})


@task_prerun.connect
def drop_broken_connections(sender: Any = None, **_kwargs: Any) -> None:
    """Before each of django_weft's tasks, close the connections the database closed.

    Celery's Django fixup closes connections around a task only every
    ``CELERY_DB_REUSE_MAX`` tasks, so after a database restart a worker process would
    fail every task on its dead connection for that long. Connections that work are
    kept (docs/explanation/guarantees.md, "When the database or the broker goes away").
    """
    if getattr(sender, "name", None) not in WEFT_TASKS:
        return
    dropped = outages.drop_broken_connections()
    if dropped:
        logger.warning("database %s had lost its connection: closed, the task opens a new one", dropped)


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
