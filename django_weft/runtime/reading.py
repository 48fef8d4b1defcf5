"""Reading runs: look-up by run id or workflow id, description, history, a run's latest
signals, updates and timers, waiting for a result, and the figures of ``weft_status`` and
the admin's dashboard.

Every read here goes to the primary database unless its caller says it may lag
(``may_lag=True``: a page that only shows rows, read from ``WEFT_READ_DATABASE``); a read
about a row already read (a run's history, its signals) goes where that row was read
from. :func:`~.process.reading_alias` makes the choice
(docs/explanation/scaling.md, "Read replicas")."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Generic, TypeVar

from django.db.models import Count, Min, Model, Q, QuerySet
from django.db.models.functions import TruncMinute

from ..engine import codec
from ..engine.error_types import ErrorType
from ..engine.errors import (
    ResultTimeout,
    WorkflowCancelled,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowTimedOut,
)
from ..engine.records import (
    TERMINAL_STATUSES,
    RunStatus,
)
from ..models import Schedule, Signal, Step, Timer, Update, WorkflowRun
from ..models.querysets import WorkflowRunQuerySet
from ..models.runs import WORKFLOW_ID_MAX_LENGTH
from .awaiting import RESULT_BACKOFF, Found, Pending, await_for, wait_for
from .process import get_store, reading_alias
from .records import HistoryEntry, RunRecord, SignalRecord, TimerRecord, UpdateRecord


def run_queryset(*, may_lag: bool = False, same_database_as: Model | None = None) -> WorkflowRunQuerySet:
    """Every run, on the primary database, or with ``may_lag`` on ``WEFT_READ_DATABASE``,
    or on the database ``same_database_as`` was read from (:func:`~.process.reading_alias`):
    what the admin's and the API's lists filter."""
    return WorkflowRun.objects.using(reading_alias(may_lag=may_lag, same_database_as=same_database_as)).all()


def schedule_queryset(*, may_lag: bool = False, same_database_as: Model | None = None) -> QuerySet[Schedule]:
    """Every schedule, read as :func:`run_queryset` reads runs."""
    return Schedule.objects.using(reading_alias(may_lag=may_lag, same_database_as=same_database_as)).all()


def get_run(ref: str | uuid.UUID, *, may_lag: bool = False) -> WorkflowRun:
    """The run with this run id, or the latest run with this workflow id; from the primary
    database, or with ``may_lag`` (a page that only shows it) from ``WEFT_READ_DATABASE``,
    where a run started a moment ago may not be yet.

    Raises ``WorkflowNotFound`` when there is none, without a query for a reference no
    run can have (a NUL or another control character, a lone surrogate, longer than a
    workflow id may be): every caller, whatever surface it serves, is covered, and the
    database never sees text it would refuse."""
    runs = run_queryset(may_lag=may_lag)
    run = None
    run_uuid = as_run_id(ref)
    if run_uuid is not None:
        run = runs.filter(pk=run_uuid).first()
    if run is None and could_be_workflow_id(str(ref)):
        run = runs.for_workflow_id(str(ref)).first()
    if run is None:
        raise WorkflowNotFound(f"no workflow run has run id or workflow id {str(ref)!r}", ref=str(ref))
    return run


def as_run_id(ref: str | uuid.UUID) -> uuid.UUID | None:
    """``ref`` as a run id if it has a run id's shape, else ``None`` (it may still be a
    workflow id that looks like one: :func:`get_run` tries both)."""
    if isinstance(ref, uuid.UUID):
        return ref
    try:
        return uuid.UUID(str(ref))
    except ValueError:
        return None


def could_be_workflow_id(text: str) -> bool:
    """Whether a run could have ``text`` as its workflow id: not empty, at most
    ``WORKFLOW_ID_MAX_LENGTH`` characters, no control character, no lone surrogate (a
    start refuses each of these)."""
    return bool(text) and len(text) <= WORKFLOW_ID_MAX_LENGTH and codec.text_flaw(text) is None


def read_run(ref: str | uuid.UUID) -> RunRecord:
    """The run with this run id (or the latest with this workflow id), as a record."""
    return RunRecord.of(get_run(ref))


def read_run_at(run_id: uuid.UUID, seq: int) -> tuple[RunRecord, HistoryEntry | None]:
    """The run with run id ``run_id`` and its step at position ``seq`` (``None`` if it has
    none yet): one query when the step exists. Raises ``WorkflowNotFound``."""
    step = (
        Step.objects.using(reading_alias())
        .select_related("run")
        .filter(run_id=run_id, seq=seq)
        .order_by()
        .first()
    )
    if step is not None:
        return RunRecord.of(step.run), HistoryEntry.of(step)
    return read_run(run_id), None


_ENTRY_COLUMNS = tuple(field.name for field in fields(HistoryEntry))
"""The step columns a :class:`HistoryEntry` is made of (same names)."""
_PAYLOAD_COLUMNS = ("args", "result")


def read_history(run: WorkflowRun, *, payloads: bool = True) -> list[HistoryEntry]:
    """The run's recorded steps, in order.

    With ``payloads=False`` the steps' ``args`` and ``result`` are not read (``None`` in
    the entries): for a view of a long history that shows neither, like the admin's
    timeline, which reads the payloads of the steps it lists with :func:`read_steps_at`.
    Rows are read as tuples, without making model instances, from the database ``run``
    was read from."""
    columns = _ENTRY_COLUMNS if payloads else tuple(c for c in _ENTRY_COLUMNS if c not in _PAYLOAD_COLUMNS)
    unread: dict[str, Any] = {} if payloads else dict.fromkeys(_PAYLOAD_COLUMNS)
    steps = Step.objects.using(reading_alias(same_database_as=run)).filter(run=run).order_by("seq")
    return [
        HistoryEntry(**dict(zip(columns, row, strict=True)), **unread) for row in steps.values_list(*columns)
    ]


def read_steps_at(
    positions: Mapping[str, Iterable[int]], *, may_lag: bool = False, same_database_as: Model | None = None
) -> dict[str, dict[int, HistoryEntry]]:
    """The recorded steps at the given positions of several runs (run id -> seqs), in one
    query: what a page of parked runs waits on. Positions without a step are left out.
    Read where :func:`~.process.reading_alias` says for ``may_lag`` and ``same_database_as``."""
    wanted = Q()
    for run_id, seqs in positions.items():
        listed = sorted(set(seqs))
        if listed:
            wanted |= Q(run_id=run_id, seq__in=listed)
    found: dict[str, dict[int, HistoryEntry]] = {}
    if not wanted:
        return found
    # No order: Step's default ordering would join the run table to sort by it.
    alias = reading_alias(may_lag=may_lag, same_database_as=same_database_as)
    steps = Step.objects.using(alias).filter(wanted).order_by()
    for run_id, *row in steps.values_list("run_id", *_ENTRY_COLUMNS):
        entry = HistoryEntry(**dict(zip(_ENTRY_COLUMNS, row, strict=True)))
        found.setdefault(str(run_id), {})[entry.seq] = entry
    return found


_Row = TypeVar("_Row")


@dataclass(frozen=True)
class Latest(Generic[_Row]):
    """The newest rows of a run's list, and how many the list has in all."""

    rows: list[_Row]
    total: int

    @property
    def more(self) -> bool:
        """Whether the list has rows older than those read."""
        return self.total > len(self.rows)


def read_signals(run: WorkflowRun, *, limit: int = 50) -> Latest[SignalRecord]:
    """The run's latest ``limit`` signals, newest first, consumed or buffered (from the
    database ``run`` was read from, as the two lists below)."""
    signals = Signal.objects.using(reading_alias(same_database_as=run)).filter(run=run)
    rows = [SignalRecord.of(signal) for signal in signals.order_by("-id")[:limit]]
    return Latest(rows, _total(signals, rows, limit))


def read_updates(run: WorkflowRun, *, limit: int = 50) -> Latest[UpdateRecord]:
    """The run's latest ``limit`` updates, newest first, with their outcomes."""
    updates = Update.objects.using(reading_alias(same_database_as=run)).filter(run=run)
    rows = [UpdateRecord.of(update) for update in updates.order_by("-id")[:limit]]
    return Latest(rows, _total(updates, rows, limit))


def read_timers(run: WorkflowRun, *, limit: int = 50) -> Latest[TimerRecord]:
    """The run's timers, the latest-firing ``limit`` first: those not fired yet and those
    fired and kept (a fired timer may be removed once its wait is over)."""
    timers = Timer.objects.using(reading_alias(same_database_as=run)).filter(run=run)
    rows = [TimerRecord.of(timer) for timer in timers.order_by("-fire_at", "-id")[:limit]]
    return Latest(rows, _total(timers, rows, limit))


def _total(rows_of_run: Any, read: list[Any], limit: int) -> int:
    # A list shorter than the limit is the whole list: no COUNT.
    return len(read) if len(read) < limit else rows_of_run.count()


def describe(run: WorkflowRun) -> dict[str, Any]:
    """The run as a dict (:meth:`RunRecord.as_dict`)."""
    return RunRecord.of(run).as_dict()


def history(run: WorkflowRun) -> list[dict[str, Any]]:
    """The run's recorded steps as dicts (:meth:`HistoryEntry.as_dict`)."""
    return [entry.as_dict() for entry in read_history(run)]


def result_of(run_id: str, timeout: float | None = None) -> Any:
    """Wait for the run to finish and return its result, or raise its outcome's error
    (``ResultTimeout`` after ``timeout`` seconds).

    A ``continued`` run is followed to its successor, and a run closed by a reset to the
    run that replaced it (a finished run reset later keeps its own outcome). Each look is
    one short autocommit read (:func:`look_at_result`); this thread sleeps between them.
    """
    return wait_for(look_at_result, str(run_id), timeout, RESULT_BACKOFF)


async def aresult_of(run_id: str, timeout: float | None = None) -> Any:
    """:func:`result_of` for a coroutine: between looks the wait holds no thread and no
    database connection (:func:`~django_weft.runtime.awaiting.await_for`)."""
    return await await_for(look_at_result, str(run_id), timeout, RESULT_BACKOFF)


def look_at_result(run_id: str) -> Found | Pending[str]:
    """One look at a run awaited for its result: its result, its outcome's error
    (raised), or the run to look at next time (a continued or reset run's successor)."""
    current = run_id
    runs = run_queryset()
    while True:
        row = runs.filter(pk=current).values("status", "result", "error", "workflow_id").first()
        if row is None:
            raise WorkflowNotFound(f"run {current} no longer exists", ref=current)
        status = row["status"]
        if status == RunStatus.COMPLETED:
            return Found(row["result"])
        if status == RunStatus.CONTINUED:
            current = (row["result"] or {})["continued_as"]
            continue
        replaced_by = _closed_by_reset(status, row["error"])
        if replaced_by is not None:
            current = replaced_by
            continue
        if status in TERMINAL_STATUSES:
            raise _outcome_error(current, row["workflow_id"], status, row["error"] or {})
        return Pending(current, partial(_result_timeout, current, status))


def _result_timeout(run_id: str, status: str, timeout: float) -> ResultTimeout:
    return ResultTimeout(
        f"run {run_id} is still {status} after {timeout} s; call result() again later",
        run_id=run_id,
        status=status,
    )


def _closed_by_reset(status: str, error: Any) -> str | None:
    """The run that replaced a run a reset closed, else ``None``."""
    if status != RunStatus.CANCELLED or not isinstance(error, dict) or error.get("type") != ErrorType.RESET:
        return None
    replaced_by = error.get("reset_to")
    return str(replaced_by) if replaced_by else None


def _outcome_error(run_id: str, workflow_id: str, status: str, error: dict[str, Any]) -> Exception:
    if status == RunStatus.FAILED:
        return WorkflowFailed(
            f"run {run_id} ({workflow_id}) failed: {error.get('type')}: {error.get('message')}",
            run_id=run_id,
            workflow_id=workflow_id,
            error_type=error.get("type"),
            error_message=error.get("message"),
            error_traceback=error.get("traceback"),
            details=error,
        )
    if status == RunStatus.CANCELLED:
        return WorkflowCancelled(
            f"run {run_id} ({workflow_id}) was cancelled",
            run_id=run_id,
            workflow_id=workflow_id,
            reason=error.get("reason"),
        )
    return WorkflowTimedOut(
        f"run {run_id} ({workflow_id}) passed its execution timeout", run_id=run_id, workflow_id=workflow_id
    )


@dataclass(frozen=True)
class StatusReport:
    """What an operator checks first: how many runs are in each state and what is overdue."""

    counts: dict[str, int]
    """Runs per status, every status listed (0 when there are none)."""
    oldest_waiting: RunRecord | None
    """The waiting run that parked longest ago (least recently updated)."""
    oldest_runnable: RunRecord | None
    """The unclaimed running run that has been runnable longest: the backlog's head."""
    expired_leases: int
    """Owned runs whose lease has expired (the sweep hands them to another worker)."""
    due_timers: int
    oldest_due_timer: datetime | None
    counts_by_workflow: dict[str, dict[str, int]]
    """Per workflow name (sorted), its runs per status; only statuses it has runs in."""
    read_at: datetime
    """The database clock when the report was read."""


def status_report(*, may_lag: bool = False) -> StatusReport:
    """Counts per status and per workflow, the oldest waiting and runnable runs, expired
    leases and due timers, read without a transaction (each figure is exact at its own
    moment; together they are a snapshot within milliseconds).

    The counts are one ``GROUP BY workflow_name, status`` over the run table: it reads the
    whole table, so its cost grows with the runs kept (retention bounds them). The other
    figures read partial indexes (runnable runs, owned leases, unfired timers).

    With ``may_lag`` (the admin's dashboard) it is read from ``WEFT_READ_DATABASE``: the
    figures are then those of the moment the replica has replayed to, measured against its
    clock, so under a lag of seconds leases and due timers look that much older."""
    store = get_store(may_lag=may_lag)
    runs = WorkflowRun.objects.using(store.alias)
    counts: dict[str, int] = {str(status): 0 for status in RunStatus}
    by_workflow: dict[str, dict[str, int]] = {}
    # order_by(): the model's default ordering would join the GROUP BY.
    for row in runs.order_by().values("workflow_name", "status").annotate(n=Count("pk")):
        counts[row["status"]] = counts.get(row["status"], 0) + row["n"]
        by_workflow.setdefault(row["workflow_name"], {})[row["status"]] = row["n"]
    now = store.db_now()
    timers = Timer.objects.using(store.alias).due(now).aggregate(n=Count("pk"), oldest=Min("fire_at"))
    oldest_waiting = runs.filter(status=RunStatus.WAITING).order_by("updated_at").first()
    oldest_runnable = runs.runnable().order_by("ready_at").first()
    return StatusReport(
        counts=counts,
        oldest_waiting=RunRecord.of(oldest_waiting) if oldest_waiting is not None else None,
        oldest_runnable=RunRecord.of(oldest_runnable) if oldest_runnable is not None else None,
        expired_leases=runs.expired_leases(now, 0).count(),
        due_timers=timers["n"],
        oldest_due_timer=timers["oldest"],
        counts_by_workflow=dict(sorted(by_workflow.items())),
        read_at=now,
    )


@dataclass(frozen=True)
class FinishedPerMinute:
    """Runs finished in each minute of a window: ``counts[i]`` in the minute starting at
    ``start + i`` minutes; the last minute is the current one, still going."""

    start: datetime
    """The first minute (on the minute, UTC)."""
    counts: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def peak(self) -> int:
        return max(self.counts, default=0)

    def minute(self, index: int) -> datetime:
        """When the ``index``-th minute starts."""
        return self.start + timedelta(minutes=index)


def finished_per_minute(
    minutes: int = 60, *, now: datetime | None = None, may_lag: bool = False
) -> FinishedPerMinute:
    """How many runs finished in each of the last ``minutes`` minutes, the current minute
    last, from one ``GROUP BY`` on the minute of ``finished_at``. ``now`` defaults to the
    database clock.

    It reads only the runs updated in the window, through the partial index on terminal
    runs' ``updated_at`` (``weft_run_terminal_updated``, which retention also uses), never
    the table: a run's ``finished_at`` is written in the same statement as its
    ``updated_at``, and ``updated_at`` only grows after that, so a run that finished in
    the window was updated in it. ``finished_at`` itself has no index (it would be one more
    index write per finished run, for this one query). ``may_lag``: read from
    ``WEFT_READ_DATABASE``."""
    minutes = max(int(minutes), 1)
    store = get_store(may_lag=may_lag)
    if now is None:
        now = store.db_now()
    start = now.astimezone(UTC).replace(second=0, microsecond=0) - timedelta(minutes=minutes - 1)
    rows = (
        WorkflowRun.objects.using(store.alias)
        .filter(status__in=sorted(TERMINAL_STATUSES), updated_at__gte=start, finished_at__gte=start)
        .order_by()
        .annotate(minute=TruncMinute("finished_at", tzinfo=UTC))
        .values("minute")
        .annotate(n=Count("pk"))
    )
    counts = [0] * minutes
    for row in rows:
        index = int((row["minute"] - start).total_seconds() // 60)
        if 0 <= index < minutes:  # a run finished after ``now`` belongs to the next report
            counts[index] += row["n"]
    return FinishedPerMinute(start=start, counts=tuple(counts))
