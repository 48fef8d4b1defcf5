"""The text the store's hand-written statements share (table names, the step columns,
the fence and condition fragments) and the conversion of their rows to engine values:
written once, read by :mod:`.sql` and the areas that write their own statements."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import F, Lookup
from django.db.models.lookups import In
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ..engine import codec
from ..engine.records import StepRecord
from ..models import Signal, Step, Timer, Update, WorkflowRun

RUN_TABLE = WorkflowRun._meta.db_table
STEP_TABLE = Step._meta.db_table
TIMER_TABLE = Timer._meta.db_table
UPDATE_TABLE = Update._meta.db_table
SIGNAL_TABLE = Signal._meta.db_table

STEP_COLUMNS = (
    "run_id, seq, kind, name, status, args, result, error, attempt, "
    "started_at, finished_at, created_at, updated_at, epoch, failed_attempts"
)
STEP_ON_CONFLICT = (
    "ON CONFLICT (run_id, seq) DO UPDATE SET status = excluded.status, "
    "result = excluded.result, error = excluded.error, attempt = excluded.attempt, "
    # An activity's step is its last attempt: when that began. A wait's began with the wait.
    f"started_at = CASE WHEN excluded.kind = 'activity' THEN excluded.started_at "
    f"ELSE {STEP_TABLE}.started_at END, "
    "finished_at = excluded.finished_at, updated_at = excluded.updated_at, "
    "failed_attempts = excluded.failed_attempts"
)


LAST_STEP_VALUES = (
    "%(step_seq)s, %(step_kind)s, %(step_name)s, %(step_status)s, %(step_args)s::jsonb, "
    "%(step_result)s::jsonb, %(step_error)s::jsonb, %(step_attempt)s, %(step_started)s, "
    "%(step_finished)s, %(step_stamp)s, %(step_stamp)s, %(step_epoch)s, %(step_failed)s::jsonb"
)
"""A step's values (:data:`STEP_COLUMNS` after ``run_id``) in a statement that has other
``result`` and ``error`` parameters: the terminal commit that records the last step."""

OWNED_BY_KEY = "id = %(id)s AND owner_id IS NOT DISTINCT FROM %(owner)s AND owner_epoch = %(epoch)s "
"""The fence of a PostgreSQL statement: the run row, found by its primary key, owned by
``%(owner)s`` under ``%(epoch)s``.

``IS NOT DISTINCT FROM`` is ``=`` here (an owner is never NULL), but the planner cannot
infer ``owner_id IS NOT NULL`` from it: with ``=`` it may serve the statement from the
partial index of owned runs (``weft_run_owned_lease``), reading every entry of it, when
its statistics say that index is small; a prepared statement keeps that plan while the
index grows (an entry per claim until vacuum). By the key, a fence reads one row
whatever the table holds. The claim's condition on the status (the partial indexes of
running and active runs) and a completion's on its pending updates are written the same
way, for the same reason."""

UNFIRED = "num_nulls(fired_at) = 1 "
"""A timer not fired yet, in a prepared statement that finds a run's timers by the run:
``fired_at IS NULL`` would let the planner read the partial index of unfired timers
(``weft_timer_unfired``, by time, every run's) whole instead, when its statistics say
it is small (after a wake fired most timers); ``num_nulls`` says the same and implies
no index predicate (PostgreSQL rewrites ``IS NOT DISTINCT FROM NULL`` to ``IS NULL``)."""

CLAIM_COLUMNS = (
    "workflow_id, workflow_name, args, kwargs, owner_epoch, attempt, created_at, "
    "parent_id, search_attributes, cancel_request, priority, trace_context"
)
"""The run's columns a claim returns, in the order :func:`.claims.claimed_run` reads them
(then the database's time, whether it was a takeover, and when the work was due)."""

HOLDS_SLOT = "AND (concurrency_key IS NULL OR slot = 'held') "
"""A claim's condition for flow control: a run counted by a concurrency limit is claimed
only once it holds a slot (:mod:`.flow` gives it one, under its key's lock)."""


def aware(value: str | datetime) -> datetime:
    if isinstance(value, str):
        parsed = parse_datetime(value)
        assert parsed is not None, value
        value = parsed
    if timezone.is_naive(value):
        value = value.replace(tzinfo=UTC)
    return value


def json_value(value: Any) -> Any:
    return codec.loads(value) if isinstance(value, str | bytes) else value


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def moment_of(value: int | str | datetime) -> datetime:
    """A step's time as the history read gives it: microseconds since the epoch
    (PostgreSQL: exact, and a tenth of the cost of loading a ``timestamptz``), or a
    datetime or its text (SQLite)."""
    if isinstance(value, int):
        return _EPOCH + timedelta(microseconds=value)
    return aware(value)


def step_record(row: Sequence[Any]) -> StepRecord:
    """A :class:`StepRecord` from ``seq, kind, name, status, result, error, attempt,
    started_at, finished_at, failed_attempts`` columns."""
    seq, kind, name, status, result, error, attempt, started, finished, failed = row
    return StepRecord(
        seq=seq,
        kind=kind,
        name=name,
        status=status,
        result=json_value(result),
        error=json_value(error),
        attempt=attempt,
        started_at=moment_of(started) if started is not None else None,
        finished_at=moment_of(finished) if finished is not None else None,
        failed_attempts=tuple(json_value(failed)) if failed is not None else (),
    )


class AnyOf(Lookup):
    """``column = ANY(%s)`` with the values bound as one array on PostgreSQL, ``IN (...)``
    elsewhere: for the sweep's batches of up to a thousand keys, whose ``IN`` list cost
    more to build, send and parse than the statement took to run. Used directly in
    ``filter()``: ``filter(any_of("pk", keys))``. As ``__in``: each value goes through
    the field's conversion (a bad one raises before any SQL is sent) and ``None`` is
    left out (it matches no row, and would make ``exclude()`` match none either)."""

    lookup_name = "weft_any"
    prepare_rhs = False

    def get_db_prep_lookup(self, value: Any, connection: Any) -> Any:
        field = self.lhs.output_field
        prepared = [field.get_db_prep_value(each, connection) for each in value if each is not None]
        return "%s", (prepared,)

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        return In(self.lhs, [each for each in self.rhs if each is not None]).as_sql(compiler, connection)

    def as_postgresql(self, compiler: Any, connection: Any) -> Any:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        element = self.lhs.output_field.db_type(connection)  # a foreign key's: its target's
        return f"{lhs} = ANY({rhs}::{element}[])", (*lhs_params, *rhs_params)


def any_of(field: str, values: Any) -> AnyOf:
    """``field`` is one of ``values`` (see :class:`AnyOf`)."""
    return AnyOf(F(field), list(values))
