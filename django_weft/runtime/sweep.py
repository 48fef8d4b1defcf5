"""The sweep (``tick``): the database holds the pending work, and this finds it."""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field

from ..conf import weft_settings
from ..engine import clock, observe
from ..engine.executor import Engine
from ..engine.ports import Dispatcher
from ..engine.records import ClaimedRun
from ..engine.registry import registry
from ..engine.run_logging import get_logger
from ..store import ClaimAs
from .bulk_jobs import process_bulk_jobs
from .dispatch import LocalDispatcher, delivers, get_dispatcher, ring_turn
from .process import get_store
from .retention import purge_expired
from .schedules import fire_due_schedules
from .worker import dispatch_finalizer

logger = get_logger("django_weft.runtime")


@dataclass
class OwnThreads:
    """The turn threads of the process whose sweep this is (``weft_worker``'s): the
    runnable runs the sweep sends them are claimed for their engine in the sweep's own
    transaction, and handed over claimed (:meth:`LocalDispatcher.dispatch_claimed`)."""

    engine: Engine
    dispatcher: LocalDispatcher
    limit: int
    """Runs to claim at most (what the threads take soon); the others are only sent."""
    began: float = field(default=float("-inf"), init=False)
    """The engine clock's reading before the claim was written: its leases count from then."""

    def claim_as(self) -> ClaimAs:
        config = self.engine.config()
        self.began = clock.monotonic()
        return ClaimAs(
            self.engine.engine_id, config.lease_ttl, self.limit, self.engine.workflows.workflow_names()
        )

    def hand(self, claimed: ClaimedRun) -> None:
        """Hold ``claimed`` (the heartbeat renews its lease from now on) and queue it; a
        dispatcher closed by a stopping worker takes none: the run is released."""
        self.engine.hold(claimed, since=self.began)
        if not self.dispatcher.dispatch_claimed(claimed):
            self.engine.let_go(claimed)


@dataclass
class TickReport:
    fired: int = 0
    dispatched: int = 0
    purged: int = 0
    """Terminal runs deleted by retention (a pass at most once a minute per process)."""
    run_ids: list[str] = field(default_factory=list)
    taken_over: list[str] = field(default_factory=list)
    """The dispatched runs whose owner's lease had expired (its worker died or stalled)."""
    closed_children: list[str] = field(default_factory=list)
    """Child runs cancelled because their parent had closed (its parent-close policy)."""
    finalizers: int = 0
    """Finalizer attempts sent (first attempts of timed-out runs, retries, lost attempts)."""
    schedules: int = 0
    """Schedules that were due (or held buffered fires) and were handled."""
    bulk: int = 0
    """Runs a bulk job reached (changed, skipped or failed): one batch of one job per tick."""
    admitted: int = 0
    """Runs queued for a concurrency slot that a freed slot let in."""
    handed_on: int = 0
    """Runs woken because an activity concurrency slot was handed on to an attempt of theirs."""
    batch: int = 0
    """The ``WEFT_TICK_BATCH`` this sweep ran with."""
    dispatch_limit: int | None = None
    """The most runs this sweep could dispatch, when its caller set fewer than ``batch``
    (``weft_worker``: what its threads have room for)."""
    held_back: bool = False
    """Runs were due a dispatch, and ``dispatch_limit`` was 0: none was sent."""
    claimed: int = 0
    """Of the runs dispatched, those claimed for the sweep's own threads (``own_threads``)."""

    @property
    def backlog(self) -> bool:
        """Whether a part of this sweep stopped at its batch (or the dispatch at its
        limit): more of that work is likely due now, and a worker with room should sweep
        again without waiting a tick."""
        if self.batch <= 0:
            return False
        if self.held_back or (self.dispatch_limit is not None and 0 < self.dispatch_limit <= self.dispatched):
            return True
        counts = (self.fired, self.dispatched, self.finalizers, self.schedules, self.admitted, self.handed_on)
        return max(counts) >= self.batch


_last_purge = [0.0]
_last_sample = [float("-inf")]
PURGE_EVERY = 60.0
"""Seconds between the retention passes of one process's sweep."""
IDLE_BUCKET_AFTER = 3600.0
"""Seconds after its last moment a rate limit bucket is forgotten (it gives the next
attempt the same moment as no bucket: now)."""
PURGE_MAX_BATCHES = 10
"""A sweep's retention pass reads at most this many batches (``WEFT_TICK_BATCH`` runs
each, deleted or kept), so it never holds up the timers and dispatches of the next
ticks for long;
``manage.py weft_gc`` and the Celery task ``django_weft.gc`` have no such limit."""


def tick(
    dispatcher: Dispatcher | None = None,
    *,
    redispatch_after: float | None = None,
    workflows: Collection[str] | None = None,
    dispatch_limit: int | None = None,
    own_threads: OwnThreads | None = None,
) -> TickReport:
    """One sweep: fire due timers and schedules, dispatch runnable runs and expired leases,
    then work on one batch of a bulk job.

    Safe to run from several processes at once: rows are taken with
    ``select_for_update(skip_locked=True)``, so each timer fires once.

    ``redispatch_after`` (default ``WEFT_REDISPATCH_AFTER``) is how long a run that was
    sent to a worker may stay unclaimed before this sweep sends it again. ``weft_worker``
    passes half its tick interval: its sweep feeds its own threads, so a run that another
    process sent to a queue nobody consumes (a Celery queue, with no Celery worker
    running) is taken within a tick or two instead of after ``WEFT_REDISPATCH_AFTER``,
    while the runs a sweep has just handed to its threads are not sent again meanwhile.

    ``workflows`` (``weft_worker`` passes the workflows it has registered) limits the
    runs and finalizers dispatched to those of these workflows (a worker without a
    workflow's code would leave its finalizer unrun); timers, schedules and the rest are
    swept for every run.

    ``dispatch_limit`` (``weft_worker`` passes what its threads have room for) caps the
    runs dispatched below ``WEFT_TICK_BATCH``; the rest stay runnable, for the next sweep
    or another worker's.

    ``own_threads`` (``weft_worker``'s, on PostgreSQL): the runnable runs this sweep
    dispatches are claimed for that engine in the sweep's own transaction and handed to
    its threads claimed, with their histories (docs/explanation/architecture.md).
    """
    dispatcher = dispatcher or get_dispatcher()
    store = get_store()
    batch = weft_settings.TICK_BATCH
    report = TickReport(batch=batch)
    dispatch_batch = batch
    if dispatch_limit is not None and dispatch_limit < batch:
        report.dispatch_limit = dispatch_batch = max(dispatch_limit, 0)
    deliver = delivers(dispatcher)
    workflow_limits = registry.concurrency_limits()
    # Workflows known here without a limit: runs of theirs still queued (a deploy removed
    # the limit) are let go by the backstop below.
    unlimited = registry.workflow_names() - set(workflow_limits)
    activity_limits = registry.activity_concurrency_limits()
    # One read says which parts have work; an idle sweep ends with it (and the chores below).
    work = store.probe.pending(
        grace=weft_settings.TAKEOVER_GRACE,
        workflows=workflows,
        workflow_limits=workflow_limits,
        activity_limits=activity_limits,
        dispatch=deliver,
        unlimited=unlimited,
    )
    if work.timers:
        report.fired = len(store.sweep.fire_due_timers(batch))
    if work.schedules_due or work.schedules_buffered:
        report.schedules = fire_due_schedules(batch, pending=(work.schedules_due, work.schedules_buffered))
    # Children left running by parents that closed without applying their policy (a
    # process died in between; timed-out parents always come this way, in this sweep when
    # their deadline fired in it).
    if work.orphans or work.timers:
        report.closed_children = store.sweep.close_orphaned_children(batch)
    parents = store.sweep.wake_waiting_parents(batch) if work.parents else []
    # A run timed out by its deadline or cancelled as an orphan in this sweep may have a
    # finalizer due now.
    if work.finalizers or (deliver and (work.timers or report.closed_children)):
        finalizers = store.finalizers.claim_due_finalizers(batch, weft_settings.REDISPATCH_AFTER, workflows)
        for run_id, attempt in finalizers:
            dispatch_finalizer(run_id, attempt, dispatcher)
        report.finalizers = len(finalizers)
    # Concurrency slots freed without the run's ending handing them on (a cancel, a
    # timeout, a process that died in between): the queued runs they let in are runnable
    # now, and dispatched below.
    if work.admissions:
        report.admitted = len(store.flow.admit_waiting(workflow_limits, batch, unlimited=unlimited))
    # Activity slots freed without their release (a worker died: the slot's lease ran
    # out): the attempts queued first get them, and their runs are woken.
    if work.hand_ons:
        woken = store.activity_flow.hand_on_waiting(activity_limits, weft_settings.LEASE_TTL, batch)
        for run_id in woken:
            ring_turn(dispatcher, run_id)
        report.handed_on = len(woken)
    # Parts above make runs runnable (timers, schedules, admissions, woken parents, a
    # parked child sent its parent's cancellation request): the dispatch reads whenever
    # one of them did something, as well as when the probe saw work.
    made_runnable = report.fired or report.schedules or report.admitted or parents or report.closed_children
    if deliver and (work.dispatch or made_runnable) and not dispatch_batch:
        report.held_back = True
    elif deliver and (work.dispatch or made_runnable):
        sent = store.sweep.claim_dispatch_batch(
            dispatch_batch,
            weft_settings.REDISPATCH_AFTER if redispatch_after is None else redispatch_after,
            weft_settings.TAKEOVER_GRACE,
            workflows,
            claim_as=None if own_threads is None else own_threads.claim_as(),
        )
        for claimed in sent.claimed:
            assert own_threads is not None
            own_threads.hand(claimed)
        ids = sent.runnable + sent.expired
        for run_id in ids:
            ring_turn(dispatcher, run_id, priority=sent.priorities.get(run_id, 0))
        ids = [claimed.run_id for claimed in sent.claimed] + ids
        if ids:
            logger.debug("tick: dispatched %s", ", ".join(ids))
        report.dispatched = len(ids)
        report.claimed = len(sent.claimed)
        report.run_ids = ids
        report.taken_over = sent.expired
    if work.bulk:
        report.bulk = process_bulk_jobs(batch)
    if time.monotonic() - _last_purge[0] > PURGE_EVERY:
        _last_purge[0] = time.monotonic()
        report.purged = purge_expired(batch=batch, max_batches=PURGE_MAX_BATCHES).purged_total
        store.activity_flow.forget_idle_buckets(IDLE_BUCKET_AFTER)
    if observe.wants_queue_samples():
        sample_queues()
    return report


def sample_queues(*, force: bool = False) -> None:
    """Read the work waiting for the observers' gauges, at most once every
    ``WEFT_METRICS_SAMPLE_INTERVAL`` per process (unless ``force``). A failed read is
    logged: gauges keep their last values, and the tick goes on."""
    if not force and time.monotonic() - _last_sample[0] < weft_settings.METRICS_SAMPLE_INTERVAL:
        return
    _last_sample[0] = time.monotonic()
    try:
        sample = get_store().sweep.sample_queues()
    except Exception:
        logger.warning("tick: could not read the queues for the metrics", exc_info=True)
        return
    observe.queue_sampled(sample)
