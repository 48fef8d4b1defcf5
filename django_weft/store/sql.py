"""The store's one database helper (:class:`StoreSql`), held by every area of the store:
every raw SQL statement, the clock, and the mapping of rows to engine records.

Fencing (docs/explanation/guarantees.md, "Ownership, epochs and fencing"): a write an
owner makes for its run succeeds only while the run row still names that owner at that
epoch. The hot step commit is one statement, a conditional row lock feeding the step
upsert (PostgreSQL: a ``FOR UPDATE`` CTE; SQLite: ``INSERT ... SELECT ... WHERE`` under
SQLite's single writer). External transitions lock the same row and rotate the epoch,
so whichever commits second sees the other.

Lease times use the database clock on PostgreSQL (``now()``), so clock skew between
worker hosts cannot make a live lease look expired. SQLite is embedded: its clock is the
local clock. A test's virtual clock (:mod:`django_weft.engine.clock`) replaces both:
its time is bound as a parameter where the statement would read ``now()``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models.functions import Now
from django.dispatch import Signal as DjangoSignal
from django.utils import timezone

from .. import signals
from ..conf import weft_settings
from ..engine import clock, codec
from ..engine.records import (
    RunStatus,
    StepRecord,
    StepWrite,
    TimerWrite,
)
from ..engine.run_logging import get_logger
from ..models import WorkflowRun
from ..models.querysets import WorkflowRunQuerySet

try:
    import psycopg
except ImportError:  # SQLite-only installs
    psycopg = None  # type: ignore[assignment]

from .base import deposed, unanswered_error
from .statement_parts import (
    LAST_STEP_VALUES,
    OWNED_BY_KEY,
    RUN_TABLE,
    STEP_COLUMNS,
    STEP_ON_CONFLICT,
    STEP_TABLE,
    TIMER_TABLE,
    UNFIRED,
    UPDATE_TABLE,
    aware,
    step_record,
)

logger = get_logger("django_weft.store")

_Fetched = TypeVar("_Fetched")

_STEP_SQL: dict[str, str] = {}


class StoreSql:
    """The store's one database helper, held by every area of the store: the database
    alias and connection, the clock (the database's, or a test's virtual clock), the
    run rows, Django signals sent on commit, and the statements written by hand (the
    claim, the step commit, the terminal commit, lease renewal, timer upserts, a reset's
    copies)."""

    def __init__(self, alias: str | None = None) -> None:
        self._alias = alias

    @property
    def alias(self) -> str:
        return self._alias or weft_settings.DATABASE_ALIAS

    @property
    def connection(self) -> BaseDatabaseWrapper:
        return connections[self.alias]

    @property
    def is_postgres(self) -> bool:
        return self.connection.vendor == "postgresql"

    @property
    def clock_in_sql(self) -> bool:
        """Whether a statement reads the time itself (PostgreSQL's ``now()``): on
        PostgreSQL unless a virtual clock is installed, whose time is bound instead."""
        return self.connection.vendor == "postgresql" and clock.installed() is None

    def local_now(self) -> datetime:
        """The time, without a round trip: the virtual clock's if one is installed, else the
        process's clock (SQLite's database clock; a stamp that needs no precision)."""
        virtual = clock.installed()
        return timezone.now() if virtual is None else virtual.now()

    def now_value(self) -> Any:
        """The time to write in an ORM update: the database's ``Now()`` (so the statement
        is what it is without the seam), or the virtual clock's time as a value."""
        virtual = clock.installed()
        return Now() if virtual is None else virtual.now()

    def now_expression(self) -> Any:
        """The time a read compares with, taken inside its statement: ``Now()`` on
        PostgreSQL (no round trip for ``now()``), else the time :meth:`db_now` gives."""
        return Now() if self.clock_in_sql else self.local_now()

    def exist(self, querysets: Sequence[Any]) -> list[bool]:
        """Whether each of ``querysets`` has a row, all in one statement (``SELECT EXISTS
        (...), EXISTS (...)``), with no lock and no transaction."""
        return self.run_exists(*self.exists_statement(querysets))

    def exists_statement(self, querysets: Sequence[Any]) -> tuple[str, list[Any]]:
        """The statement of :meth:`exist` and its parameters, compiled (for a caller that
        keeps it: compiling costs more than running it)."""
        parts: list[str] = []
        params: list[Any] = []
        for queryset in querysets:
            text, more = queryset.query.exists().get_compiler(using=self.alias).as_sql()
            parts.append(f"EXISTS ({text})")
            params.extend(more)
        return "SELECT " + ", ".join(parts), params

    def with_values(self, statement: str, params: Sequence[Any]) -> str:
        """``statement`` (Django's ``%s`` placeholders) with ``params`` written in as
        PostgreSQL literals, quoted by psycopg, to run with no parameters.

        For a statement run often with the same values, prepared: a generic plan is made
        without its parameters' values, so a partial index whose predicate names a value
        (``status = 'running'``) cannot serve it, and the plan reads a wider index instead;
        with the values in its text, the one plan is made for them."""
        self.connection.ensure_connection()
        raw = self.connection.connection
        literals = tuple(psycopg.sql.Literal(value).as_string(raw) for value in params)
        # Run with an empty parameter list, the text is read for placeholders again: a
        # literal's "%" (a workflow named "10% off") is written "%%".
        return (statement % literals).replace("%", "%%")

    def run_exists(self, statement: str, params: Sequence[Any]) -> list[bool]:
        """Run a statement of :meth:`exists_statement`: prepared on PostgreSQL (planned
        once per connection)."""
        if self.is_postgres:
            row = self.fetch_prepared(statement, params)
        else:
            with self.connection.cursor() as cursor:
                cursor.execute(statement, params)
                row = cursor.fetchone()
        assert row is not None
        return [bool(value) for value in row]

    def run_key(self, run_id: str | uuid.UUID) -> Any:
        value = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
        return WorkflowRun._meta.pk.get_db_prep_value(value, self.connection)

    def dt(self, value: datetime | None) -> Any:
        return self.connection.ops.adapt_datetimefield_value(value)

    def runs(self) -> WorkflowRunQuerySet:
        return WorkflowRun.objects.using(self.alias)

    def owned(self, run_id: str, owner: str, epoch: int) -> WorkflowRunQuerySet:
        return self.runs().filter(pk=run_id, owner_id=owner, owner_epoch=epoch)

    def announce_finish(
        self,
        run_id: str,
        workflow_id: str,
        workflow_name: str,
        status: str,
        error_json: str | None,
        finished_at: datetime,
    ) -> None:
        if status == RunStatus.COMPLETED:
            self.announce(signals.run_completed, run_id, workflow_id, workflow_name, finished_at=finished_at)
        elif status in (RunStatus.FAILED, RunStatus.CANCELLED):
            error = codec.loads(error_json) if error_json else None
            signal = signals.run_failed if status == RunStatus.FAILED else signals.run_cancelled
            self.announce(signal, run_id, workflow_id, workflow_name, error=error, finished_at=finished_at)

    def announce(
        self,
        signal: DjangoSignal,
        run_id: uuid.UUID | str,
        workflow_id: str,
        workflow_name: str,
        **extra: Any,
    ) -> None:
        """Send a Django signal once the current transaction commits (at once in autocommit)."""
        if not signal.has_listeners(WorkflowRun):
            return

        def send() -> None:
            for receiver, response in signal.send_robust(
                sender=WorkflowRun,
                run_id=str(run_id),
                workflow_id=workflow_id,
                workflow_name=workflow_name,
                **extra,
            ):
                if isinstance(response, Exception):
                    logger.error(
                        "run %s: receiver %r of a django_weft signal raised",
                        run_id,
                        receiver,
                        exc_info=response,
                    )

        transaction.on_commit(send, using=self.alias)

    def db_now(self) -> datetime:
        """The database clock (the transaction's start on PostgreSQL), or the virtual
        clock's time if a test installed one (:mod:`django_weft.engine.clock`)."""
        if not self.clock_in_sql:
            return self.local_now()
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            return aware(cursor.fetchone()[0])

    def transition_now(self) -> datetime:
        """The database clock *after* the row lock was taken (``clock_timestamp()``, not the
        transaction's start): later than every commit the lock waited for."""
        if not self.clock_in_sql:
            return self.local_now()
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            return aware(cursor.fetchone()[0])

    def sql_now(self, params: dict[str, Any]) -> str:
        """The time inside a PostgreSQL statement: ``now()``, or with a virtual clock
        installed a parameter ``%(now)s`` bound to its time (added to ``params``)."""
        if self.clock_in_sql:
            return "now()"
        params["now"] = self.local_now()
        return "%(now)s"

    def _history_columns(self) -> str:
        """The step columns :func:`step_record` reads, from ``seq`` on."""
        times = "started_at, finished_at"
        if self.is_postgres:  # ``extract`` gives an exact numeric (PostgreSQL 14 and later)
            times = (
                "(extract(epoch FROM started_at) * 1000000)::int8, "
                "(extract(epoch FROM finished_at) * 1000000)::int8"
            )
        return f"seq, kind, name, status, result, error, attempt, {times}, failed_attempts"

    def load_histories(self, run_ids: Sequence[str]) -> dict[str, dict[int, StepRecord]]:
        """The recorded steps of each of ``run_ids`` (PostgreSQL), in one query; a run
        with none is absent."""
        histories: dict[str, dict[int, StepRecord]] = {}
        if not run_ids:
            return histories
        sql = (
            f"SELECT run_id, {self._history_columns()} FROM {STEP_TABLE} "
            "WHERE run_id = ANY(%(ids)s) ORDER BY run_id, seq"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, {"ids": [self.run_key(run_id) for run_id in run_ids]})
            for row in cursor.fetchall():
                histories.setdefault(str(row[0]), {})[row[1]] = step_record(row[1:])
        return histories

    def load_steps(self, run_id: str) -> dict[int, StepRecord]:
        """The recorded steps of a run, in one query."""
        sql = f"SELECT {self._history_columns()} FROM {STEP_TABLE} WHERE run_id = %(id)s ORDER BY seq"
        params = {"id": self.run_key(run_id)}
        if self.is_postgres:  # once per turn of a run with a history: prepared
            return {row[0]: step_record(row) for row in self.fetch_all_prepared(sql, params)}
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return {row[0]: step_record(row) for row in cursor.fetchall()}

    def _step_sql(self, connection: BaseDatabaseWrapper | None = None) -> str:
        vendor = (connection or self.connection).vendor
        sql = _STEP_SQL.get(vendor)
        if sql is None:
            sql = _STEP_SQL[vendor] = self._build_step_sql()
        return sql

    def step_values(self) -> str:
        """The step columns' placeholders (:data:`STEP_COLUMNS` after ``run_id``)."""
        cast = "::jsonb" if self.is_postgres else ""
        return (
            f"%(seq)s, %(kind)s, %(name)s, %(status)s, %(args)s{cast}, %(result)s{cast}, "
            f"%(error)s{cast}, %(attempt)s, %(started)s, %(finished)s, %(stamp)s, %(stamp)s, %(epoch)s, "
            f"%(failed)s{cast}"
        )

    def _build_step_sql(self) -> str:
        values = self.step_values()
        if self.is_postgres:
            return (
                f"WITH fence AS (SELECT id FROM {RUN_TABLE} WHERE {OWNED_BY_KEY}FOR UPDATE) "
                f"INSERT INTO {STEP_TABLE} ({STEP_COLUMNS}) SELECT fence.id, {values} FROM fence "
                f"{STEP_ON_CONFLICT} RETURNING id"
            )
        return (
            f"INSERT INTO {STEP_TABLE} ({STEP_COLUMNS}) SELECT id, {values} FROM {RUN_TABLE} "
            "WHERE id = %(id)s AND owner_id = %(owner)s AND owner_epoch = %(epoch)s "
            f"{STEP_ON_CONFLICT} RETURNING id"
        )

    def step_params(
        self,
        run_id: str,
        owner: str,
        epoch: int,
        step: StepWrite,
        connection: BaseDatabaseWrapper | None = None,
    ) -> dict[str, Any]:
        connection = connection or self.connection
        adapt = connection.ops.adapt_datetimefield_value
        return {
            "id": WorkflowRun._meta.pk.get_db_prep_value(uuid.UUID(str(run_id)), connection),
            "owner": owner,
            "epoch": epoch,
            "seq": step.seq,
            "kind": step.kind,
            "name": step.name,
            "status": step.status,
            "args": step.args_json,
            "result": step.result_json,
            "error": step.error_json,
            "attempt": step.attempt,
            "started": adapt(step.started_at),
            "finished": adapt(step.finished_at),
            "stamp": adapt(step.finished_at or step.started_at),
            "failed": step.failed_attempts_json,
        }

    def write_step(self, cursor: CursorWrapper, run_id: str, owner: str, epoch: int, step: StepWrite) -> None:
        cursor.execute(self._step_sql(), self.step_params(run_id, owner, epoch, step))
        self._check_step_written(cursor.fetchone(), run_id, owner, epoch, step)

    @staticmethod
    def _check_step_written(
        row: tuple[Any, ...] | None, run_id: str, owner: str, epoch: int, step: StepWrite
    ) -> None:
        if row is None:
            raise deposed(run_id, owner, epoch, f"step {step.seq} ({step.kind} {step.name})")

    def commit_step(self, run_id: str, owner: str, epoch: int, step: StepWrite) -> None:
        """Record one step in one statement, fenced on (owner, epoch). Raises ``Deposed``."""
        connection = self.connection
        if connection.vendor == "postgresql":
            # The hottest statement: prepared, so PostgreSQL parses and plans it once per
            # connection instead of once per step (the connection looked up once).
            row = self._run_prepared(
                self._step_sql(connection),
                self.step_params(run_id, owner, epoch, step, connection),
                psycopg.Cursor.fetchone,
                connection,
            )
            self._check_step_written(row, run_id, owner, epoch, step)
            return
        with connection.cursor() as cursor:
            self.write_step(cursor, run_id, owner, epoch, step)

    def fetch_prepared(
        self, statement: str, params: Mapping[str, Any] | Sequence[Any]
    ) -> tuple[Any, ...] | None:
        """On PostgreSQL: run ``statement`` as a server-side prepared statement on the
        underlying psycopg connection (``WEFT_PREPARE_STATEMENTS``; Django's default
        client-side binding cannot prepare) and return its first row."""
        return self._run_prepared(statement, params, psycopg.Cursor.fetchone)

    def fetch_all_prepared(
        self, statement: str, params: Mapping[str, Any] | Sequence[Any]
    ) -> list[tuple[Any, ...]]:
        """:meth:`fetch_prepared`, every row."""
        return self._run_prepared(statement, params, psycopg.Cursor.fetchall)

    def _run_prepared(
        self,
        statement: str,
        params: Mapping[str, Any] | Sequence[Any],
        fetch: Callable[[psycopg.Cursor[Any]], _Fetched],
        connection: BaseDatabaseWrapper | None = None,
    ) -> _Fetched:
        connection = connection or self.connection
        # As Django's cursors do: a connection that fails its health check is replaced.
        connection.close_if_health_check_failed()
        connection.ensure_connection()
        raw = connection.connection
        prepare = weft_settings.PREPARE_STATEMENTS
        if prepare and raw.prepare_threshold is None:
            # Django opens connections with prepared statements off, and psycopg then
            # ignores prepare=True. Re-enable them with a threshold nothing reaches, so
            # only statements asked for explicitly (these) are prepared.
            raw.prepare_threshold = 2**31 - 1
        began = time.monotonic()
        try:
            # Django's error wrapping, as its own cursors have: a dropped connection raises
            # Django's OperationalError and marks the connection for closing.
            # An error inside the caller's atomic block marks it for rollback, as an error
            # of Django's own cursors does.
            alias, atomic = connection.alias, connection.in_atomic_block
            with (
                transaction.mark_for_rollback_on_error(alias) if atomic else contextlib.nullcontext(),
                connection.wrap_database_errors,
                psycopg.Cursor(raw) as cursor,
            ):
                return fetch(cursor.execute(statement, params, prepare=prepare or None))
        finally:
            if connection.queries_logged:  # DEBUG, or a test capturing queries: as Django's cursors
                shown = psycopg.ClientCursor(raw).mogrify(statement, params)
                connection.queries_log.append({"sql": shown, "time": f"{time.monotonic() - began:.3f}"})

    def set_search_attributes(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, attributes: dict[str, Any]
    ) -> None:
        """Record ``step`` and merge ``attributes`` into the run's search attributes (``None``
        removes a key), fenced on (owner, epoch): both are written or neither. Raises
        ``Deposed``.

        PostgreSQL: one statement, the conditional UPDATE of the run row (the fence, and the
        same row lock a step commit takes) feeding the step INSERT. SQLite: the same UPDATE,
        with ``json_patch`` (RFC 7396: a null removes the key), then the fenced step INSERT,
        in one transaction."""
        params = self.step_params(run_id, owner, epoch, step)
        if self.is_postgres:
            kept = {key: value for key, value in attributes.items() if value is not None}
            now = self.sql_now(params)
            sql = (
                f"WITH fence AS (UPDATE {RUN_TABLE} SET search_attributes = "
                f"(search_attributes || %(set)s::jsonb) - %(removed)s::text[], updated_at = {now} "
                f"WHERE {OWNED_BY_KEY}RETURNING id) "
                f"INSERT INTO {STEP_TABLE} ({STEP_COLUMNS}) SELECT fence.id, {self.step_values()} "
                f"FROM fence {STEP_ON_CONFLICT} RETURNING id"
            )
            params["set"] = codec.dumps(kept)
            params["removed"] = [key for key in attributes if key not in kept]
            with self.connection.cursor() as cursor:
                cursor.execute(sql, params)
                self._check_step_written(cursor.fetchone(), run_id, owner, epoch, step)
            return
        sql = (
            f"UPDATE {RUN_TABLE} SET search_attributes = json_patch(search_attributes, %(patch)s), "
            "updated_at = %(stamp)s WHERE id = %(id)s AND owner_id = %(owner)s AND owner_epoch = %(epoch)s"
        )
        params["patch"] = codec.dumps(attributes)
        with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            if cursor.rowcount != 1:
                raise deposed(run_id, owner, epoch, f"step {step.seq} ({step.kind} {step.name})")
            self.write_step(cursor, run_id, owner, epoch, step)

    def write_timers(
        self, cursor: CursorWrapper, run_id: str, timers: Iterable[TimerWrite], now: datetime
    ) -> None:
        sql = (
            f"INSERT INTO {TIMER_TABLE} (run_id, seq, kind, fire_at, fired_at, created_at) "
            "VALUES (%(id)s, %(seq)s, %(kind)s, %(fire_at)s, NULL, %(now)s) "
            "ON CONFLICT (run_id, seq, kind) DO UPDATE SET fire_at = excluded.fire_at, fired_at = NULL"
        )
        for timer in timers:
            cursor.execute(
                sql,
                {
                    "id": self.run_key(run_id),
                    "seq": timer.seq,
                    "kind": timer.kind,
                    "fire_at": self.dt(timer.fire_at),
                    "now": self.dt(now),
                },
            )

    def finish_in_one_statement(
        self,
        run_id: str,
        owner: str,
        epoch: int,
        *,
        status: str,
        result_json: str | None,
        error_json: str | None,
        category: str,
        steps: Sequence[StepWrite] = (),
    ) -> tuple[str, str, bool | None, datetime] | None:
        """The owner's terminal commit on PostgreSQL; ``(workflow_id, workflow_name,
        queued, finished_at)``, or ``None`` if the fence did not match (nothing written).
        ``queued`` is ``None`` for a run no concurrency limit counts, else whether runs of
        its workflow are queued for a slot (read in the same statement, so a limit nobody
        waits for costs no round trip to hand the slot on). ``steps``, the run's last
        steps, are recorded by the same statement."""
        # One statement (one round trip): the conditional UPDATE is the fence, and the
        # timer DELETE (and the step INSERT) only sees a row if the UPDATE matched.
        params: dict[str, Any] = {
            "status": status, "result": result_json, "error": error_json, "category": category,
            "id": self.run_key(run_id), "owner": owner, "epoch": epoch,
            "unanswered": codec.dumps(unanswered_error(status)),
        }  # fmt: skip
        now = self.sql_now(params)
        last_steps = ""
        for index, step in enumerate(steps):
            # An INSERT of its own per step (a VALUES list would type its NULLs as text).
            for name, value in self.step_params(run_id, owner, epoch, step).items():
                params[f"step{index}_{name}"] = value
            values = LAST_STEP_VALUES.replace("%(step_", f"%(step{index}_")
            last_steps += (
                f"stepped{index} AS (INSERT INTO {STEP_TABLE} ({STEP_COLUMNS}) SELECT done.id, {values} "
                f"FROM done {STEP_ON_CONFLICT}), "
            )
        sql = (
            f"WITH done AS (UPDATE {RUN_TABLE} SET status = %(status)s, result = %(result)s::jsonb, "
            "error = %(error)s::jsonb, failure_category = %(category)s, owner_id = NULL, "
            "lease_expires_at = NULL, ready_at = NULL, dispatched_at = NULL, waiting_on = NULL, "
            f"finished_at = {now}, updated_at = {now} "
            f"WHERE {OWNED_BY_KEY}"
            "RETURNING id, workflow_id, workflow_name, concurrency_key, finished_at), "
            f"{last_steps}"
            f"gone AS (DELETE FROM {TIMER_TABLE} WHERE run_id IN (SELECT id FROM done) AND {UNFIRED}), "
            f"unanswered AS (UPDATE {UPDATE_TABLE} SET status = 'failed', error = %(unanswered)s::jsonb, "
            f"updated_at = {now} WHERE run_id IN (SELECT id FROM done) AND status IS NOT DISTINCT FROM "
            "'accepted') "
            "SELECT workflow_id, workflow_name, CASE WHEN concurrency_key IS NOT NULL THEN EXISTS (SELECT 1 "
            f"FROM {RUN_TABLE} queued WHERE queued.workflow_name = done.workflow_name AND queued.slot = "
            "'queued' AND queued.status = 'pending' AND queued.concurrency_key IS NOT NULL) END, finished_at "
            "FROM done"
        )
        row = self.fetch_prepared(sql, params)  # prepared: planning it costs more than running it
        return None if row is None else (row[0], row[1], row[2], aware(row[3]))

    def lock_workflow_id(self, workflow_id: str) -> None:
        """PostgreSQL: a transaction-scoped advisory lock on a workflow id."""
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 7321))", [workflow_id])
