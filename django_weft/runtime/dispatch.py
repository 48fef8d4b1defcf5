"""Dispatchers: how a process asks a worker to run a turn of a run soon.

A dispatch is a doorbell, never the record of work: runnable runs, due timers and
expired leases live in the database and the sweep (``tick``) finds them anyway.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from django.utils import timezone
from django.utils.module_loading import import_string

from ..conf import weft_settings
from ..engine.errors import ConfigurationError
from ..engine.ports import Dispatcher


class SweepOnlyDispatcher:
    """Rings no bell: a worker's sweep picks the run up within ``WEFT_TICK_INTERVAL``.

    The default without Celery, for processes (web servers, shells) that cannot reach
    the worker directly.
    """

    delivers = False

    def dispatch_turn(self, run_id: str, *, eta: datetime | None = None) -> None:
        return None

    def dispatch_activity(
        self, run_id: str, seq: int, attempt: int, *, queue: str, timeout: float | None = None
    ) -> None:
        return None


@dataclass(frozen=True)
class Work:
    """One unit of work in a :class:`LocalDispatcher`: a turn of a run, or an attempt of
    a queued activity (``seq`` and ``attempt`` set)."""

    run_id: str
    seq: int | None = None
    attempt: int | None = None

    @property
    def is_activity(self) -> bool:
        return self.seq is not None


class LocalDispatcher:
    """An in-process queue of turns and queued activity attempts, consumed by
    ``weft_worker`` threads (which serve every activity queue).

    Duplicate dispatches of work already queued are folded into one. ``eta`` dispatches
    wait in a heap until due.
    """

    delivers = True

    def __init__(self) -> None:
        self._queue: queue.Queue[Work] = queue.Queue()
        self._queued: set[Work] = set()
        self._lock = threading.Lock()
        self._delayed: list[tuple[float, int, str]] = []
        self._counter = itertools.count()

    def dispatch_turn(self, run_id: str, *, eta: datetime | None = None) -> None:
        if eta is not None:
            delay = (eta - timezone.now()).total_seconds()
            if delay > 0:
                with self._lock:
                    heapq.heappush(self._delayed, (time.monotonic() + delay, next(self._counter), run_id))
                return
        self._put(Work(str(run_id)))

    def dispatch_activity(
        self, run_id: str, seq: int, attempt: int, *, queue: str, timeout: float | None = None
    ) -> None:
        self._put(Work(str(run_id), seq, attempt))

    def _put(self, work: Work) -> None:
        with self._lock:
            if work in self._queued:
                return
            self._queued.add(work)
        self._queue.put(work)

    def release_due(self) -> None:
        """Move delayed dispatches whose time has come onto the queue."""
        now = time.monotonic()
        due = []
        with self._lock:
            while self._delayed and self._delayed[0][0] <= now:
                due.append(heapq.heappop(self._delayed)[2])
        for run_id in due:
            self.dispatch_turn(run_id)

    def next_due_in(self) -> float | None:
        with self._lock:
            return max(self._delayed[0][0] - time.monotonic(), 0.0) if self._delayed else None

    def get(self, timeout: float) -> Work | None:
        """The next piece of work, or ``None`` after ``timeout`` seconds."""
        try:
            work = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        with self._lock:
            self._queued.discard(work)
        return work

    def qsize(self) -> int:
        return self._queue.qsize()


_process_override: list[Dispatcher] = []


def use_dispatcher(dispatcher: Dispatcher | None) -> None:
    """Make ``dispatcher`` this process's dispatcher (``weft_worker`` does), or undo it."""
    _process_override.clear()
    if dispatcher is not None:
        _process_override.append(dispatcher)


@lru_cache(maxsize=8)
def _instantiate(path: str) -> Dispatcher:
    try:
        factory = import_string(path)
    except ImportError as exc:
        raise ConfigurationError(f"WEFT_DISPATCHER {path!r} cannot be imported: {exc}") from None
    return factory()


def get_dispatcher() -> Dispatcher:
    """The process override if any, else an instance of ``WEFT_DISPATCHER``."""
    if _process_override:
        return _process_override[0]
    return _instantiate(weft_settings.DISPATCHER)


def delivers(dispatcher: Dispatcher) -> bool:
    return bool(getattr(dispatcher, "delivers", True))
