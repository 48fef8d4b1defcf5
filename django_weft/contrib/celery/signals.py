"""Worker-process hooks: a connection the database closed is dropped before a task uses
it, a Celery worker's pool processes advertise what they can run from their start, and
give up held runs when they exit."""

from __future__ import annotations

from typing import Any

from celery import current_app
from celery.signals import (
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from ...engine.run_logging import get_logger
from ...runtime import outages
from . import ACTIVITY_TASK, GC_TASK, TICK_TASK, TURN_TASK

logger = get_logger("django_weft.celery")

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


def consumed_queues() -> frozenset[str] | None:
    """The queues this worker consumes (``-Q``, or every configured queue); ``None`` if
    Celery does not say."""
    try:
        queues = current_app.amqp.queues
        return frozenset((queues.consume_from or queues).keys())
    except Exception:
        return None


def start_advertising() -> None:
    """Advertise this process as a Celery worker and start its heartbeat, which writes the
    advert at once and with every beat (the database is not touched in this thread)."""
    from ...models import Worker
    from ...runtime.heartbeat import ensure_heartbeat
    from ...runtime.workers import advertise_as, is_advertising

    if not is_advertising():
        advertise_as(Worker.Kind.CELERY, consumed_queues=consumed_queues())
    ensure_heartbeat()


@worker_process_init.connect
def advertise_pool_process(**_kwargs: Any) -> None:
    """A prefork pool process (or the solo pool's worker) starts: it runs the tasks."""
    start_advertising()


@worker_ready.connect
def advertise_thread_pool(sender: Any = None, **_kwargs: Any) -> None:
    """The threads pool runs tasks in the worker's main process, which no
    ``worker_process_init`` announces. A prefork parent runs none: it does not advertise."""
    pool = getattr(sender, "pool", None)
    if pool is not None and type(pool).__module__ == "celery.concurrency.thread":
        start_advertising()


@worker_init.connect
@worker_ready.connect
def freeze_loaded_objects(**_kwargs: Any) -> None:
    """What the worker's main process loaded (Django, the apps, the workflows) is frozen
    out of the garbage collector's walks before its pool starts, so prefork pool
    processes inherit it frozen and share its pages
    (:func:`~django_weft.runtime.freeze_loaded_objects`; once per process, so
    ``worker_ready`` only catches a main process ``worker_init`` missed). A pool process
    runs no collection of its own right after its fork: a finalizer run there could wait
    on a lock another thread held at the fork."""
    from ...runtime import freeze_loaded_objects as freeze

    freeze()


@worker_process_shutdown.connect
@worker_shutdown.connect
def release_held_runs(**_kwargs: Any) -> None:
    """A process that stops cleanly releases the runs it still holds (after a warm
    shutdown there are none), so other workers need not wait for the leases to expire,
    and deletes its worker row."""
    from ...runtime import get_engine
    from ...runtime.heartbeat import stop_heartbeat
    from ...runtime.workers import stop_advertising

    try:
        released = get_engine().release_all()
        if released:
            logger.info("released %d runs at shutdown", len(released))
    except Exception:
        logger.warning("could not release held runs at shutdown; their leases expire", exc_info=True)
    finally:
        stop_heartbeat()
        stop_advertising()
