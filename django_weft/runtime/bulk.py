"""A lifecycle operation applied to many runs: the admin's actions, and each batch of a
bulk job (:mod:`.bulk_jobs`, the REST ``runs/bulk/`` route).

:func:`apply_bulk` takes run ids or a ``WorkflowRun`` queryset, reads them in batches and
calls the single-run lifecycle function (:mod:`.lifecycle`) on each, in a transaction of
its own: one run that cannot change, or fails unexpectedly, never holds back or rolls back
the others. It returns a :class:`BulkOutcome` saying which runs changed, which were
skipped and why (grouped by reason), and which failed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from django.db.models import QuerySet

from ..engine.errors import InvalidInput, InvalidTransition, WorkflowNotFound, WorkflowTerminalError
from ..engine.records import RunStatus
from ..engine.run_logging import get_logger
from ..models import WorkflowRun
from . import lifecycle
from .operations import BULK_OPERATIONS, OPERATIONS, Operation
from .process import reading_alias
from .reading import run_queryset

logger = get_logger("django_weft.runtime")

DEFAULT_BATCH_SIZE = 100
NO_SUCH_RUN = "no such run"
ANOTHER_RUN_ACTIVE = "another run with its workflow id is active"


@dataclass(frozen=True)
class BulkOperation:
    """One lifecycle operation as :func:`apply_bulk` applies it: its description in the
    catalogue (:mod:`.operations`) and the single-run function that changes one run."""

    described: Operation
    apply: Callable[[str, str | None], object]
    """Changes one run (by run id), with the reason when the operation takes one; raises
    ``WorkflowTerminalError``/``InvalidTransition`` when the run's status does not allow it."""

    @property
    def name(self) -> str:
        return self.described.name


_APPLY: Mapping[str, Callable[[str, str | None], object]] = {
    "cancel": lambda run_id, reason: lifecycle.cancel(run_id, reason),
    "terminate": lambda run_id, reason: lifecycle.cancel(run_id, reason),
    "request_cancel": lambda run_id, reason: lifecycle.cancel(run_id, reason, mode="request"),
    "suspend": lambda run_id, _: lifecycle.suspend(run_id),
    "resume": lambda run_id, _: lifecycle.resume(run_id),
    "retry": lambda run_id, _: lifecycle.retry(run_id),
}
assert set(_APPLY) == set(BULK_OPERATIONS)


def operation_named(name: str) -> BulkOperation:
    """The bulk operation called ``name``; raises ``InvalidInput`` naming the known ones."""
    if name not in _APPLY:
        raise InvalidInput(f"unknown bulk operation {name!r}; use one of {', '.join(sorted(_APPLY))}")
    return BulkOperation(OPERATIONS[name], _APPLY[name])


def refusal_for(operation: str, status: str) -> str | None:
    """Why ``operation`` leaves a run in ``status`` as it is, in words (the reason a bulk
    outcome skips it under, e.g. "already finished (completed)" or "not suspended
    (running)"), or ``None`` if the operation applies to that status."""
    return operation_named(operation).described.refusal_for(status)


@dataclass(frozen=True)
class BulkRun:
    """A run a bulk operation reached."""

    run_id: str
    workflow_id: str = ""
    """Empty for a run id that matched no run."""

    @property
    def label(self) -> str:
        """How a person recognises the run: its workflow id, else its run id."""
        return self.workflow_id or self.run_id


@dataclass(frozen=True)
class BulkFailure:
    """A run the operation failed on unexpectedly (the error is logged with its traceback)."""

    run: BulkRun
    error: str
    """The error's type and message."""


@dataclass(frozen=True)
class BulkOutcome:
    """What :func:`apply_bulk` did, run by run."""

    operation: str
    changed: tuple[BulkRun, ...] = ()
    skipped: Mapping[str, tuple[BulkRun, ...]] = field(default_factory=dict)
    """The runs left as they were, by reason, reasons in the order first met."""
    failed: tuple[BulkFailure, ...] = ()

    @property
    def changed_ids(self) -> list[str]:
        return [run.run_id for run in self.changed]

    @property
    def skipped_count(self) -> int:
        return sum(len(runs) for runs in self.skipped.values())

    @property
    def total(self) -> int:
        """The runs reached: changed, skipped and failed."""
        return len(self.changed) + self.skipped_count + len(self.failed)


class _Tally:
    def __init__(self, operation: str) -> None:
        self.operation = operation
        self.changed: list[BulkRun] = []
        self.skipped: dict[str, list[BulkRun]] = {}
        self.failed: list[BulkFailure] = []

    def skip(self, run: BulkRun, reason: str) -> None:
        self.skipped.setdefault(reason, []).append(run)

    def outcome(self) -> BulkOutcome:
        return BulkOutcome(
            operation=self.operation,
            changed=tuple(self.changed),
            skipped={reason: tuple(runs) for reason, runs in self.skipped.items()},
            failed=tuple(self.failed),
        )


Row = tuple[uuid.UUID, str, str]
"""A run as a batch reads it: ``(pk, workflow_id, status)``."""


def _run_ids(values: Iterable[str | uuid.UUID]) -> list[uuid.UUID]:
    """Every value as a run id, duplicates dropped, order kept; ``InvalidInput`` (naming the
    first few bad values) before anything is done if one is not a UUID."""
    if isinstance(values, (str, bytes)):
        raise InvalidInput("pass run ids as a list, not a single string")
    ids: dict[uuid.UUID, None] = {}
    bad: list[str] = []
    for value in values:
        try:
            ids[value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))] = None
        except (ValueError, TypeError, AttributeError):
            bad.append(repr(value)[:60])
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise InvalidInput(f"not a run id: {shown}; nothing was changed")
    return list(ids)


def _batches_of_ids(
    ids: list[uuid.UUID], within: QuerySet[WorkflowRun], batch_size: int, tally: _Tally
) -> Iterator[list[Row]]:
    for start in range(0, len(ids), batch_size):
        chunk = ids[start : start + batch_size]
        found = {
            row[0]: row for row in within.filter(pk__in=chunk).values_list("pk", "workflow_id", "status")
        }
        for missing in (pk for pk in chunk if pk not in found):
            tally.skip(BulkRun(str(missing)), NO_SUCH_RUN)
        yield [found[pk] for pk in chunk if pk in found]


def _batches_of_queryset(queryset: QuerySet[WorkflowRun], batch_size: int) -> Iterator[list[Row]]:
    # Keyset on the primary key, not OFFSET: a run the operation moves out of the
    # queryset's filter (a cancelled run leaves "status = waiting") would otherwise shift
    # the next page and make it skip runs. Each pk is read at most once.
    ordered = queryset.order_by("pk")
    last: uuid.UUID | None = None
    while True:
        page = ordered if last is None else ordered.filter(pk__gt=last)
        rows: list[Row] = list(page.values_list("pk", "workflow_id", "status")[:batch_size])
        if not rows:
            return
        yield rows
        last = rows[-1][0]


def _apply_one(known: BulkOperation, row: Row, reason: str | None, tally: _Tally) -> None:
    pk, workflow_id, status = row
    run = BulkRun(str(pk), workflow_id)
    # The status read with the batch says most skips without a transaction; it is a
    # status the run really had, so skipping on it is as if the run had been reached
    # then. A continued run is skipped here too: the single-run call would follow it to
    # the run it continued as, which is not the run that was asked for.
    refusal = refusal_for(known.name, status)
    if refusal is not None:
        tally.skip(run, refusal)
        return
    try:
        known.apply(run.run_id, reason)
    except WorkflowNotFound:
        tally.skip(run, NO_SUCH_RUN)  # removed (by retention) since the batch was read
    except (WorkflowTerminalError, InvalidTransition) as exc:
        # The status changed since the batch was read; the lock taken by the call saw it.
        now = str(getattr(exc, "status", "") or "")
        if known.name == "retry" and now == RunStatus.FAILED:
            tally.skip(run, ANOTHER_RUN_ACTIVE)
        else:
            tally.skip(run, (refusal_for(known.name, now) if now else None) or exc.message)
    except Exception as exc:
        logger.exception("bulk %s: run %s (%s) failed", known.name, run.run_id, workflow_id)
        tally.failed.append(BulkFailure(run, f"{type(exc).__name__}: {exc}"))
    else:
        tally.changed.append(run)


def apply_bulk(
    operation: str,
    runs: QuerySet[WorkflowRun] | Iterable[str | uuid.UUID],
    *,
    reason: str | None = None,
    within: QuerySet[WorkflowRun] | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> BulkOutcome:
    """Apply ``operation`` ("cancel", "terminate", "request_cancel", "suspend", "resume" or
    "retry") to each run ("cancel" and "terminate" are both the immediate cancel).

    ``runs`` is a ``WorkflowRun`` queryset (read in batches of ``batch_size`` by primary
    key, so runs that leave its filter as they change are not skipped; runs that enter it
    meanwhile may be reached too) or run ids (processed in the order given; one that
    matches no run of ``within``, default every run, is skipped as "no such run").

    Each run changes through the single-run lifecycle function, in a transaction of its
    own; not atomic as a whole. A run whose status does not allow the operation is
    skipped with the reason (:func:`refusal_for`); a continued run is skipped (it is not
    followed to the run it continued as); an unexpected error is logged and recorded in
    ``failed``, and the rest go on.

    The runs are read from the primary database whatever database ``runs`` or ``within``
    were made on: the status a batch reads decides skips, and a replica's may be behind
    (docs/explanation/scaling.md, "Read replicas").

    ``reason`` is for ``cancel``, ``terminate`` and ``request_cancel`` only (the last sends
    each run a cancellation request, as ``cancel(mode="request")``). Raises
    ``InvalidInput`` before changing anything for an unknown operation, a reason the
    operation does not take, an id that is not a UUID, a sliced queryset or a batch size
    below 1.
    """
    known = operation_named(operation)
    reason = known.described.check_reason(reason)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInput(f"batch_size must be a whole number of at least 1; got {batch_size!r}")
    tally = _Tally(known.name)
    batches: Iterator[list[Row]]
    if isinstance(runs, QuerySet):
        if runs.query.is_sliced:
            raise InvalidInput("a sliced queryset cannot be read in batches; filter it instead")
        batches = _batches_of_queryset(runs.using(reading_alias()), batch_size)
    else:
        ids = _run_ids(runs)
        base = within.using(reading_alias()) if within is not None else run_queryset()
        batches = _batches_of_ids(ids, base.all(), batch_size, tally)
    for rows in batches:
        for row in rows:
            _apply_one(known, row, reason, tally)
    outcome = tally.outcome()
    logger.info(
        "bulk %s: %d changed, %d skipped, %d failed",
        known.name,
        len(outcome.changed),
        outcome.skipped_count,
        len(outcome.failed),
    )
    return outcome


def count_runs(runs: QuerySet[WorkflowRun]) -> int:
    """How many runs ``runs`` holds: what a confirmation of "every run matching this
    filter" shows before :func:`apply_bulk` is asked to change them.

    This is a ``COUNT(*)`` over the filtered rows, which the run lists otherwise avoid;
    here it is one query on an explicit request to act on all of them, and the operation
    that follows reads every one of those rows anyway."""
    return runs.count()
