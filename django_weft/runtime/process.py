"""This process's engine and store, the live dispatcher, and the on-commit doorbell."""

from __future__ import annotations

import os
import threading
from datetime import datetime

from django.db import transaction

from ..conf import weft_settings
from ..engine.executor import Engine
from ..store import DjangoStore
from .dispatch import delivers, get_dispatcher


class CurrentDispatcher:
    """Resolves the dispatcher at each call, so settings and overrides apply live."""

    def dispatch_turn(self, run_id: str, *, eta: datetime | None = None) -> None:
        get_dispatcher().dispatch_turn(run_id, eta=eta)

    def dispatch_activity(
        self, run_id: str, seq: int, attempt: int, *, queue: str, timeout: float | None = None
    ) -> None:
        get_dispatcher().dispatch_activity(run_id, seq, attempt, queue=queue, timeout=timeout)


_engine_lock = threading.Lock()
_engine: Engine | None = None
_engine_pid = 0


def get_store() -> DjangoStore:
    """The store, its areas as attributes (``get_store().turns``, ``.schedules``, ...)."""
    return DjangoStore()


def get_engine() -> Engine:
    """This process's engine (one engine id per process; a forked child gets its own)."""
    global _engine, _engine_pid
    with _engine_lock:
        if _engine is None or _engine_pid != os.getpid():
            _engine = Engine(get_store().turns, CurrentDispatcher(), weft_settings.engine_config)
            _engine_pid = os.getpid()
        return _engine


def dispatch_on_commit(run_id: str, *, eta: datetime | None = None) -> None:
    """Ring the run's doorbell once the current transaction commits (if the configured
    dispatcher delivers anything; the sweep finds the run otherwise)."""
    dispatcher = get_dispatcher()
    if delivers(dispatcher):
        alias = weft_settings.DATABASE_ALIAS
        transaction.on_commit(lambda: dispatcher.dispatch_turn(run_id, eta=eta), using=alias)
