"""This process's engine and store, the database each read goes to, the live dispatcher,
the on-commit doorbell, and what a worker process does once it has loaded everything."""

from __future__ import annotations

import gc
import os
import threading
from datetime import datetime

from django.db import transaction
from django.db.models import Model

from ..conf import weft_settings
from ..engine.executor import Engine
from ..engine.run_logging import get_logger
from ..store import DjangoStore
from .dispatch import delivers, get_dispatcher, ring_activity, ring_turn

logger = get_logger("django_weft.runtime")


class CurrentDispatcher:
    """Resolves the dispatcher at each call, so settings and overrides apply live."""

    takes_priority = True

    def dispatch_turn(self, run_id: str, *, eta: datetime | None = None, priority: int = 0) -> None:
        ring_turn(get_dispatcher(), run_id, eta=eta, priority=priority)

    def dispatch_activity(
        self,
        run_id: str,
        seq: int,
        attempt: int,
        *,
        queue: str,
        timeout: float | None = None,
        priority: int = 0,
    ) -> None:
        ring_activity(get_dispatcher(), run_id, seq, attempt, queue=queue, timeout=timeout, priority=priority)


_engine_lock = threading.Lock()
_engine: Engine | None = None
_engine_pid = 0


def reading_alias(*, may_lag: bool = False, same_database_as: Model | None = None) -> str:
    """The database alias a read goes to; every choice of one is made here
    (docs/explanation/scaling.md, "Read replicas").

    By default the primary, ``WEFT_DATABASE_ALIAS``, where every write and lock goes, so
    the read sees every write committed before it. ``may_lag=True``: ``WEFT_READ_DATABASE``
    (the primary when it is unset), for a page that only shows rows and may show them as
    they were a moment ago. ``same_database_as``: the database that row was read from, so
    that what a page reads about a row comes from where the row came from, as Django
    reads a related object from its instance's database (a row never read from a
    database, made in memory, counts as the primary's).

    The alias is always named (``using``), never left to ``DATABASE_ROUTERS``: a router's
    ``db_for_read`` cannot tell a read that must see the latest writes from one that may
    lag, so with ``WEFT_READ_DATABASE`` unset nothing is read from another database,
    whatever the routers say."""
    if same_database_as is not None:
        return same_database_as._state.db or weft_settings.DATABASE_ALIAS
    return weft_settings.READ_DATABASE if may_lag else weft_settings.DATABASE_ALIAS


def get_store(*, may_lag: bool = False, same_database_as: Model | None = None) -> DjangoStore:
    """The store, its areas as attributes (``get_store().turns``, ``.schedules``, ...), on
    the primary database. With ``may_lag`` or ``same_database_as``, on the database
    :func:`reading_alias` names for them: for reads only (a replica refuses writes)."""
    if not may_lag and same_database_as is None:
        return DjangoStore()
    return DjangoStore(reading_alias(may_lag=may_lag, same_database_as=same_database_as))


def get_engine() -> Engine:
    """This process's engine (one engine id per process; a forked child gets its own)."""
    global _engine, _engine_pid
    with _engine_lock:
        if _engine is None or _engine_pid != os.getpid():
            _engine = Engine(get_store().turns, CurrentDispatcher(), weft_settings.engine_config)
            _engine_pid = os.getpid()
        return _engine


def dispatch_on_commit(run_id: str, *, eta: datetime | None = None, priority: int = 0) -> None:
    """Ring the run's doorbell once the current transaction commits. With a dispatcher
    that delivers nothing (a web process beside ``weft_worker``), on PostgreSQL with
    ``WEFT_NOTIFY``, a ``NOTIFY`` in the transaction tells the listening workers at its
    commit; the sweep finds the run otherwise."""
    dispatcher = get_dispatcher()
    if delivers(dispatcher):
        alias = weft_settings.DATABASE_ALIAS
        transaction.on_commit(lambda: ring_turn(dispatcher, run_id, eta=eta, priority=priority), using=alias)
    elif weft_settings.NOTIFY:
        get_store().intake.notify_workers(run_id, priority=priority, eta=eta)


def sends_notices() -> bool:
    """Whether new work made in this process is told to the workers by a notice
    (:func:`dispatch_on_commit`): no delivering dispatcher, ``WEFT_NOTIFY``, PostgreSQL."""
    return not delivers(get_dispatcher()) and weft_settings.NOTIFY and get_store().notices.available


_frozen_in = 0
"""The process that froze what it had loaded (:func:`freeze_loaded_objects`)."""


def freeze_loaded_objects() -> int:
    """In a worker process that has loaded everything (Django, the apps, the registered
    workflows): collect the garbage once, then move every object still alive out of the
    garbage collector's sight (``gc.freeze()``), unless ``WEFT_WORKER_GC_FREEZE`` is off.
    Those objects live as long as the process; a full collection, which a turn replaying
    a long history sets off now and then, no longer walks them all
    (docs/benchmarks.md, "Long histories"). Once per process (a forked pool process does
    it again, for what it loaded since the fork); returns how many objects it froze, 0
    if nothing was done."""
    global _frozen_in
    if not weft_settings.WORKER_GC_FREEZE or _frozen_in == os.getpid():
        return 0
    _frozen_in = os.getpid()
    before = gc.get_freeze_count()  # frozen already: by a parent process before its fork
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count() - before
    logger.info("froze the %d objects loaded at start: the garbage collector no longer walks them", frozen)
    return frozen
