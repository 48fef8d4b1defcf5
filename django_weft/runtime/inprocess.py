"""The in-process worker that ``manage.py weft_worker`` runs: turn threads, a sweep thread
and a heartbeat thread sharing one engine, fed by a :class:`LocalDispatcher`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from django.db import close_old_connections, connections

from ..conf import weft_settings
from ..engine.records import ClaimedRun
from ..engine.registry import registry
from ..engine.run_logging import get_logger
from ..models import Worker
from .dispatch import LocalDispatcher, Work, ring_turn, use_dispatcher
from .heartbeat import Heartbeat
from .outages import database_unavailable
from .process import get_engine, get_store
from .sweep import OwnThreads, tick
from .worker import run_activity
from .workers import advertise_as, stop_advertising

logger = get_logger("django_weft.worker")

SWEEP_BACKOFF_MAX = 2.0
"""Seconds between the sweep's attempts at most while they fail (the database away)."""


BACKLOG_POLL = 0.005
"""Seconds between looks at this process's queue while a backlog waits for room."""

TIMER_IDLE_WAIT = 1.0
"""Seconds the timer thread sleeps at most when no delayed doorbell is due."""

ROOM_PER_THREAD = 2
"""Runs a sweep may queue for each turn thread, whatever the threads' recent pace: one
to work on and one waiting, so a thread never waits for the sweep that refills it."""

ROOM_FLOOR = 100
"""Runs a sweep may queue, whatever the threads' recent pace: a burst of up to this many
(``WEFT_TICK_BATCH``'s default) is queued whole, so the threads take it in priority
order; beyond it, the threads' pace decides."""


class InProcessWorker:
    """Turn threads, a sweep thread, a timer thread and a heartbeat thread sharing one
    engine."""

    def __init__(self, *, threads: int, sweep: bool = True) -> None:
        self.dispatcher = LocalDispatcher()
        use_dispatcher(self.dispatcher)
        self.engine = get_engine()
        self._threads_wanted = threads
        self._sweep = sweep
        self._stopping = threading.Event()
        # Set when a work notice was left to the sweep because every thread had work
        # waiting: the sweep then runs as soon as the threads have room.
        self._passed = threading.Event()
        # Leases are renewed until the very end of a shutdown, so draining turns keep them.
        self._heartbeat = Heartbeat(self.engine)
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        advertise_as(Worker.Kind.WEFT_WORKER)
        for index in range(self._threads_wanted):
            self._spawn(self._turn_loop, f"weft-turn-{index}")
        if self._sweep:
            self._spawn(self._sweep_loop, "weft-sweep")
        if weft_settings.NOTIFY and get_store().notices.available:
            self._spawn(self._listen_loop, "weft-listen")
        self._spawn(self._timer_loop, "weft-timers")
        self._heartbeat.start()

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=self._guard(target), name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    @staticmethod
    def _guard(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            finally:
                connections.close_all()

        return run

    def _turn_loop(self) -> None:
        while not self._stopping.is_set():
            work = self.dispatcher.get(timeout=0.2)
            if work is None:
                continue
            if work.is_activity:
                self._work(work)
                continue
            try:
                self._work(work, self.dispatcher.take_claim(work.run_id))
            except BaseException:
                # The thread ends (SystemExit from workflow code, say): a claim made for
                # it meanwhile is released, not held and renewed with no thread to drive it.
                late = self.dispatcher.settle(work.run_id)
                if late is not None:
                    self.engine.let_go(late)
                raise
            # A claim this process's sweep made while this thread claimed the run in
            # vain: driven now, in the turn's place in the queue.
            late = self.dispatcher.settle(work.run_id)
            if late is not None:
                self._work(work, late)

    def _work(self, work: Work, claimed: ClaimedRun | None = None) -> None:
        try:
            if work.seq is not None and work.attempt is not None:
                run_activity(work.run_id, work.seq, work.attempt)
            else:
                self.engine.run_turn(work.run_id, claimed=claimed)
        except Exception as exc:
            what = "activity" if work.is_activity else "turn"
            retried = "it is retried after its lease expires"
            if database_unavailable(exc):
                logger.warning("run %s: %s stopped, the database is not answering (%s); %s",
                               work.run_id, what, exc, retried)  # fmt: skip
            else:
                logger.exception("run %s: %s crashed; %s", work.run_id, what, retried)
            close_old_connections()

    def _timer_loop(self) -> None:
        """Release the delayed doorbells (timers: a sleep's end, a rate limit's moment) to
        the turn threads as they come due, to the millisecond: in a thread of its own, so
        that a sweep under way does not hold them up."""
        while not self._stopping.is_set():
            self.dispatcher.wait_for_due(TIMER_IDLE_WAIT)
            self.dispatcher.release_due()

    def _sweep_loop(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                # Half a tick: a run sent elsewhere (say to Celery) but not claimed is
                # taken within a tick or two, and a run another worker's sweep has just
                # handed to that worker's threads (a backlog) is left to it, not claimed
                # by both. This sweep's dispatches go to this process's own threads;
                # only runs of the workflows registered here are sent to them (the
                # others would be marked dispatched for nothing), and no more than
                # they take within that half tick (_room). Those they take soon are
                # claimed for them in the sweep (_claim_room).
                window = weft_settings.TICK_INTERVAL / 2
                self._let_go_waiting_claims(weft_settings.TICK_INTERVAL)
                report = tick(
                    self.dispatcher,
                    redispatch_after=window,
                    workflows=registry.workflow_names(),
                    dispatch_limit=self._room(window),
                    own_threads=OwnThreads(self.engine, self.dispatcher, self._claim_room(window)),
                )
                if failures:
                    logger.info("sweep: working again after %d failed attempts", failures)
                failures = 0
                if report.backlog:
                    # More is due than one sweep takes (a backlog after a restart, timers
                    # falling due together): sweep again once the threads are nearly
                    # through this batch, not a tick later, so the backlog drains at the
                    # threads' pace.
                    self._wait_for_room(started + weft_settings.TICK_INTERVAL)
                    continue
            except Exception as exc:
                failures += 1
                if not database_unavailable(exc):
                    logger.exception("sweep failed; retrying")
                elif failures == 1:
                    logger.warning("sweep: the database is not answering (%s); retrying", exc)
                close_old_connections()
            interval = weft_settings.TICK_INTERVAL
            if failures:
                # Backing off while the database is away: a tick interval, doubled per
                # failure up to SWEEP_BACKOFF_MAX, so a restart is noticed within seconds.
                interval = min(interval * 2 ** min(failures - 1, 10), max(interval, SWEEP_BACKOFF_MAX))
                self._stopping.wait(max(interval - (time.monotonic() - started), 0.0))
            else:
                self._rest(started + interval)

    def _let_go_waiting_claims(self, longest: float) -> None:
        """Release the runs claimed for the threads that none of them took within
        ``longest`` seconds (turns longer than the pace they were claimed at): their
        leases are no longer renewed here for nothing, and any worker with room takes
        them, in their place among the runnable runs. Their turns stay queued here: a
        thread that gets to one claims the run as any turn does."""
        for claimed in self.dispatcher.drop_claims(older_than=longest):
            self.engine.let_go(claimed)

    def _room(self, window: float) -> int:
        """How many runs this process's sweep hands its threads: as many as they took in
        the last ``window`` (at least :data:`ROOM_FLOOR`, and two per thread), less those
        still waiting in its queue. A run left waiting here longer than ``window`` is no
        longer "just handed out" to another worker's sweep, which sends it again: both
        processes would then claim it, one in vain (with a large ``WEFT_TICK_BATCH``,
        about every run of a backlog). What this sweep leaves stays runnable for the next
        sweep, its own or another worker's."""
        floor = max(ROOM_FLOOR, self._threads_wanted * ROOM_PER_THREAD)
        pace = max(floor, self.dispatcher.taken_within(window))
        return max(pace - self.dispatcher.qsize(), 0)

    def _claim_room(self, window: float) -> int:
        """How many of the runs it hands its threads this process's sweep claims for them
        (PostgreSQL): as many as they took in the last ``window`` (two per thread at
        least), less those waiting in its queue; not :data:`ROOM_FLOOR`'s burst. A claimed
        run waits for this process's threads (its lease renewed), where a run only sent
        is taken by another worker's sweep once it waited ``window``: threads held up by
        long turns keep few runs from the other workers."""
        pace = max(self._threads_wanted * ROOM_PER_THREAD, self.dispatcher.taken_within(window))
        return max(pace - self.dispatcher.qsize(), 0)

    def _rest(self, deadline: float) -> None:
        """Until the next sweep is due (``deadline``), or until this process has room for
        runs whose work notices it passed on while it had none."""
        while not self._stopping.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or not self._passed.wait(left):
                return
            self._wait_for_room(deadline)
            if self.dispatcher.qsize() < self._threads_wanted:
                self._passed.clear()
                return

    def _wait_for_room(self, deadline: float) -> None:
        """Until fewer runs wait in this process's queue than it has threads (or
        ``deadline``, or a stop)."""
        while self.dispatcher.qsize() >= self._threads_wanted and time.monotonic() < deadline:
            if self._stopping.wait(BACKLOG_POLL):
                return

    def _listen_loop(self) -> None:
        """Ring this process's doorbell for each work notice (a run started, signalled or
        resumed by another process, on PostgreSQL): such a run is claimed at once, not
        at the next sweep. A lost connection is listened on again, after a backoff."""
        notices = get_store().notices
        failures = 0
        while not self._stopping.is_set():
            try:
                for run_id, priority, eta in notices.listen(self._stopping.is_set):
                    failures = 0
                    if eta is None and self.dispatcher.qsize() >= self._threads_wanted:
                        # Every thread has work waiting. Every worker gets every notice:
                        # if all of them queued every run, each run would cost a claim
                        # per worker. A worker with room claims it; failing that, this
                        # process's sweep finds it once its threads have room (_rest).
                        self._passed.set()
                        continue
                    ring_turn(self.dispatcher, run_id, eta=eta, priority=priority)
            except Exception as exc:
                failures += 1
                if not database_unavailable(exc):
                    logger.exception("listening for work notices failed; listening again")
                elif failures == 1:
                    logger.warning("work notices: the database is not answering (%s); the sweep finds new "
                                   "work meanwhile", exc)  # fmt: skip
                connections.close_all()
                self._stopping.wait(min(0.1 * 2**failures, SWEEP_BACKOFF_MAX))

    def stop(self, timeout: float) -> list[str]:
        """Stop taking work, let running turns finish up to ``timeout``, release the rest."""
        self._stopping.set()
        # A sweep under way claims nothing more for the threads: what it claims now is
        # released at once (OwnThreads.hand), the claims queued before are held and
        # released below.
        self.dispatcher.close()
        self._passed.set()  # wakes the sweep thread's rest
        self.dispatcher.wake()
        deadline = time.monotonic() + timeout
        # The sweep first, while the turns drain: a sweep mid-claim lets go what it claims
        # now (the dispatcher is closed), and must have the time to, or those runs would
        # stay owned by a process that is gone until their leases expire.
        for prefix in ("weft-sweep", "weft-turn"):
            for thread in self._threads:
                if thread.name.startswith(prefix):
                    thread.join(max(deadline - time.monotonic(), 0))
        # Claims no thread took go back to their places among the runnable runs; the
        # runs of turns still running are released below (their turns see them lost).
        waiting = self.dispatcher.drop_claims()
        released = [claimed.run_id for claimed in waiting if self.engine.let_go(claimed)]
        released += self.engine.release_all()
        self._heartbeat.stop()
        stop_advertising()
        connections.close_all()
        use_dispatcher(None)
        return released
