"""Workers say what they can run: each worker process advertises, with its heartbeat,
the workflows and activity queues it has registered, and an operator reads which runs no
live worker can execute (docs/explanation/decisions.md, "A worker claims only runs of
workflows it has").

A process advertises once :func:`advertise_as` has named its kind: ``weft_worker`` does
at start, a Celery worker's pool processes when they start (or at their first task).
Processes that only start or read runs (web servers, shells, beat) never advertise.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from ..conf import weft_settings
from ..engine.records import ACTIVE_STATUSES
from ..engine.registry import registry
from ..engine.run_logging import get_logger
from ..models import Worker
from ..store import Advert
from .process import get_engine, get_store
from .reading import StatusReport

logger = get_logger("django_weft.worker")

FORGET_AFTER = 24 * 3600.0
"""Seconds after its last heartbeat that a worker's row is deleted (by the next worker
that starts): a killed process never deletes its own."""


@dataclass(frozen=True)
class _Advertising:
    pid: int
    kind: str
    consumed_queues: frozenset[str] | None
    """The queues a Celery worker consumes; ``None``: every queue (``weft_worker``)."""


_lock = threading.Lock()
_advertising: _Advertising | None = None
_advertised_pid = 0


def advertise_as(kind: str, *, consumed_queues: Collection[str] | None = None) -> None:
    """Make this process a worker that advertises itself with each heartbeat (idempotent;
    a forked child advertises only once it calls this itself). No database access."""
    global _advertising
    with _lock:
        queues = frozenset(consumed_queues) if consumed_queues is not None else None
        _advertising = _Advertising(os.getpid(), Worker.Kind(kind).value, queues)


def is_advertising() -> bool:
    current = _advertising
    return current is not None and current.pid == os.getpid()


def advertise_now() -> None:
    """Write this process's advert (the heartbeat calls this on each beat). The first
    advert of a process also clears the dispatch mark of the runnable runs of its
    workflows, so runs that waited for a worker with their code go out at the next sweep,
    and deletes the rows of workers silent for :data:`FORGET_AFTER`."""
    global _advertised_pid
    current = _advertising
    if current is None or current.pid != os.getpid():
        return
    workflows = registry.workflow_names()
    queues = registry.activity_queues()
    if current.consumed_queues is not None:
        queues &= current.consumed_queues
    engine = get_engine()
    store = get_store()
    advert = Advert(
        engine_id=engine.engine_id,
        kind=current.kind,
        hostname=socket.gethostname(),
        pid=current.pid,
        workflows=tuple(sorted(workflows)),
        activity_queues=tuple(sorted(queues)),
    )
    store.workers.advertise(advert)
    if _advertised_pid != current.pid:
        forgotten = store.workers.forget_silent(FORGET_AFTER)
        sent = store.workers.make_runnable_again(workflows)
        # Marked done only once done: a failure here is tried again with the next heartbeat.
        _advertised_pid = current.pid
        logger.info(
            "worker %s advertises %d workflows%s%s",
            engine.engine_id,
            len(workflows),
            f"; {sent} runnable runs of them sent out again" if sent else "",
            f"; {forgotten} silent workers forgotten" if forgotten else "",
        )


def stop_advertising() -> None:
    """Delete this process's row (a clean shutdown) and advertise no more."""
    global _advertising, _advertised_pid
    current = _advertising
    if current is None or current.pid != os.getpid():
        return
    with _lock:
        _advertising = None
        _advertised_pid = 0
    try:
        get_store().workers.forget(get_engine().engine_id)
    except Exception:
        logger.warning("could not delete this worker's row; it is not live after one lease", exc_info=True)


# -- reading ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerRecord:
    engine_id: str
    kind: str
    hostname: str
    pid: int
    workflows: tuple[str, ...]
    activity_queues: tuple[str, ...]
    started_at: datetime
    heartbeat_at: datetime

    @classmethod
    def of(cls, row: Worker) -> WorkerRecord:
        return cls(
            engine_id=row.engine_id,
            kind=row.kind,
            hostname=row.hostname,
            pid=row.pid,
            workflows=tuple(row.workflows or ()),
            activity_queues=tuple(row.activity_queues or ()),
            started_at=row.started_at,
            heartbeat_at=row.heartbeat_at,
        )


@dataclass(frozen=True)
class StrandedWorkflow:
    """A workflow with active runs that no live worker has registered."""

    name: str
    counts: dict[str, int]
    """Its active runs per status (only statuses it has runs in)."""

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class StrandedSchedules:
    """A workflow with due schedules that no live worker has registered: the tick fires a
    schedule only where its workflow is registered, so these stay due."""

    name: str
    due: int
    oldest_due_at: datetime


@dataclass(frozen=True)
class WorkerCoverage:
    """The live workers, and the active runs and due schedules none of them can execute,
    by workflow."""

    live: tuple[WorkerRecord, ...]
    stranded: tuple[StrandedWorkflow, ...]
    read_at: datetime
    stranded_schedules: tuple[StrandedSchedules, ...] = ()

    @property
    def stranded_runs(self) -> int:
        return sum(workflow.total for workflow in self.stranded)

    @property
    def stranded_schedule_count(self) -> int:
        return sum(workflow.due for workflow in self.stranded_schedules)


def live_window() -> float:
    """A worker is live while its last heartbeat is at most this old (seconds): one lease
    (``WEFT_LEASE_TTL``), which is at least three heartbeats."""
    return float(weft_settings.LEASE_TTL)


def worker_coverage(report: StatusReport, *, may_lag: bool = False, schedules: bool = True) -> WorkerCoverage:
    """The live workers, and, from ``report``'s counts per workflow, the active runs
    (pending, running, waiting, suspended) of workflows that no live worker has
    registered; and the due schedules of such workflows. Two queries besides the report
    (the worker table, the due schedules of workflows no live worker has), as of the
    report's database time. ``may_lag``: read from ``WEFT_READ_DATABASE`` (as the report
    was). ``schedules=False`` leaves the schedules out (no second query)."""
    store = get_store(may_lag=may_lag)
    read_at, rows = store.workers.live(live_window(), now=report.read_at)
    live = tuple(WorkerRecord.of(row) for row in rows)
    known = {name for worker in live for name in worker.workflows}
    active = {str(status) for status in ACTIVE_STATUSES}
    stranded = []
    for name, counts in report.counts_by_workflow.items():
        waiting = {status: n for status, n in counts.items() if status in active and n}
        if waiting and name not in known:
            stranded.append(StrandedWorkflow(name, waiting))
    due = store.schedules.due_by_workflow(read_at, known) if schedules else []
    return WorkerCoverage(
        live=live,
        stranded=tuple(stranded),
        read_at=read_at,
        stranded_schedules=tuple(StrandedSchedules(*row) for row in due),
    )
