"""Dispatchers: how a process asks a worker to run a turn of a run soon.

A dispatch is a doorbell, never the record of work: runnable runs, due timers and
expired leases live in the database and the sweep (``tick``) finds them anyway.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache

from django.utils import timezone
from django.utils.module_loading import import_string

from ..conf import weft_settings
from ..engine import clock
from ..engine.errors import ConfigurationError
from ..engine.ports import Dispatcher
from ..engine.ports import ring_activity as ring_activity  # the runtime's callers import them here
from ..engine.ports import ring_turn as ring_turn
from ..engine.records import ClaimedRun


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


TAKES_KEPT = 4096
"""How many of the latest takes a :class:`LocalDispatcher` remembers the moments of
(:meth:`LocalDispatcher.taken_within` counts at most this many)."""


class LocalDispatcher:
    """An in-process queue of turns and queued activity attempts, consumed by
    ``weft_worker`` threads (which serve every activity queue).

    Duplicate dispatches of work already queued are folded into one. ``eta`` dispatches
    wait in a heap until due; released, they go before the other work of their priority
    (a timer that came due is late work: a rate limit's moment, say, is kept even while
    a burst of new runs waits in the queue).
    """

    delivers = True
    takes_priority = True

    def __init__(self) -> None:
        # (-priority, 0 for work whose timer came due else 1, arrival, work): higher
        # priority first, then due timers, then first come first served.
        self._queue: queue.PriorityQueue[tuple[int, int, int, Work]] = queue.PriorityQueue()
        self._queued: set[Work] = set()
        self._lock = threading.Lock()
        self._delayed: list[tuple[float, int, str, int]] = []
        self._counter = itertools.count()
        # Set when a delayed dispatch becomes the first due (or by wake()): the thread
        # waiting in wait_for_due() releases it on time instead of after its sleep.
        self._sooner = threading.Event()
        # When the threads took their latest pieces of work (monotonic, oldest first).
        self._taken: deque[float] = deque(maxlen=TAKES_KEPT)
        # Runs claimed for this process's engine, waiting for a thread: the claim, and the
        # engine clock's reading when it was made.
        self._claims: dict[str, tuple[ClaimedRun, float]] = {}
        self._closed = False
        # Runs whose turn a thread took and has not settled (:meth:`settle`): a claim made
        # for one meanwhile goes to that thread, not to the back of the queue.
        self._in_flight: set[str] = set()

    def dispatch_turn(self, run_id: str, *, eta: datetime | None = None, priority: int = 0) -> None:
        if eta is not None:
            delay = (eta - timezone.now()).total_seconds()
            if delay > 0:
                with self._lock:
                    entry = (time.monotonic() + delay, next(self._counter), run_id, priority)
                    heapq.heappush(self._delayed, entry)
                    first = self._delayed[0] is entry
                if first:
                    self._sooner.set()
                return
        self._put(Work(str(run_id)), priority)

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
        self._put(Work(str(run_id), seq, attempt), priority)

    def dispatch_claimed(self, claimed: ClaimedRun) -> bool:
        r"""Queue a turn of a run already claimed for this process's engine (and held by
        it): the thread that takes it drives the run with this claim
        (:meth:`take_claim`) instead of claiming it. Folded into a turn of the run
        already queued, which then carries the claim. ``False`` once :meth:`close`\ d:
        the caller releases the run."""
        with self._lock:
            if self._closed:
                return False
            self._claims[claimed.run_id] = (claimed, clock.monotonic())
            if claimed.run_id in self._in_flight:
                # A thread took a turn of this run and is claiming it, in vain now (the
                # sweep's claim held its row): it drives this claim next (settle), in the
                # place its turn had in the queue.
                return True
        self._put(Work(claimed.run_id), claimed.priority)
        return True

    def settle(self, run_id: str) -> ClaimedRun | None:
        """A thread is done with the turn of ``run_id`` it took: the claim made for it
        while the thread had it, if any (:meth:`take_claim`), for that thread to drive."""
        with self._lock:
            self._in_flight.discard(run_id)
        return self.take_claim(run_id)

    def close(self) -> None:
        """Take no more claims (a stopping worker: what it holds is released)."""
        with self._lock:
            self._closed = True

    def drop_claims(self, older_than: float = 0.0) -> list[ClaimedRun]:
        """Take back the claims queued at least ``older_than`` seconds ago that no thread
        has taken (a claim whose turn a thread took is left to it), for the caller to
        let go; their turns stay queued, and a thread that takes one claims the run as
        any turn does."""
        cutoff = clock.monotonic() - older_than
        with self._lock:
            stale = [
                run_id
                for run_id, (_, at) in self._claims.items()
                if at <= cutoff and run_id not in self._in_flight
            ]
            return [self._claims.pop(run_id)[0] for run_id in stale]

    def take_claim(self, run_id: str) -> ClaimedRun | None:
        """The claim :meth:`dispatch_claimed` queued with a turn of ``run_id``, if any (the
        thread that took the turn asks once); its ``db_now`` moved on by the time it
        waited, so the turn's clock is the database's now, not the claim's."""
        with self._lock:
            found = self._claims.pop(run_id, None)
        if found is None:
            return None
        claimed, at = found
        waited = clock.monotonic() - at
        return dataclasses.replace(claimed, db_now=claimed.db_now + timedelta(seconds=waited))

    def _put(self, work: Work, priority: int, *, due: bool = False) -> None:
        with self._lock:
            if work in self._queued:
                return
            self._queued.add(work)
        self._queue.put((-priority, 0 if due else 1, next(self._counter), work))

    def release_due(self) -> None:
        """Move delayed dispatches whose time has come onto the queue."""
        now = time.monotonic()
        due = []
        with self._lock:
            while self._delayed and self._delayed[0][0] <= now:
                _, _, run_id, priority = heapq.heappop(self._delayed)
                due.append((run_id, priority))
        for run_id, priority in due:
            self._put(Work(str(run_id)), priority, due=True)

    def next_due_in(self) -> float | None:
        with self._lock:
            return max(self._delayed[0][0] - time.monotonic(), 0.0) if self._delayed else None

    def wait_for_due(self, timeout: float) -> None:
        """Sleep ``timeout`` seconds at most, and no later than the first delayed dispatch
        is due, or one added meanwhile that is due sooner (so a timer at a rate limit's
        moment is released to the millisecond, not at the next sweep), or :meth:`wake`."""
        due_in = self.next_due_in()
        wait = timeout if due_in is None else min(timeout, due_in)
        if wait > 0 and self._sooner.wait(wait):
            self._sooner.clear()

    def wake(self) -> None:
        """End a :meth:`wait_for_due` now (at shutdown)."""
        self._sooner.set()

    def get(self, timeout: float) -> Work | None:
        """The next piece of work, or ``None`` after ``timeout`` seconds."""
        try:
            _, _, _, work = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        with self._lock:
            self._queued.discard(work)
            self._taken.append(time.monotonic())
            if not work.is_activity:
                self._in_flight.add(work.run_id)
        return work

    def qsize(self) -> int:
        return self._queue.qsize()

    def taken_within(self, seconds: float) -> int:
        """How many pieces of work the threads took in the last ``seconds``: their pace,
        which ``weft_worker``'s sweep hands them no more than (``InProcessWorker``)."""
        cutoff = time.monotonic() - seconds
        with self._lock:
            taken = list(self._taken)
        return len(taken) - bisect.bisect_left(taken, cutoff)


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
