"""Debounced starts in the database: the starts of a workflow with the same debounce key
collapsed into one pending run, decided under a lock of the key so that concurrent
starts from every process collapse too (docs/explanation/flow-control.md).

A *burst* is the pending run of a key: a delayed start (status ``pending``, a
``delayed_start`` timer) whose ``debounce_key`` is set and which holds no concurrency
slot and is queued for none. Each start of the key while it exists *joins* it: the timer
moves to ``period`` after that start (no later than ``max_wait`` after the burst's first
start) and the run takes that start's arguments. When the timer fires, the sweep (or a
claim) makes the run runnable in the same transaction, and the burst is over: the next
start opens a new one. A start that finds the burst's time passed before the sweep came
fires the timer itself, the same way, and opens the next burst.

Locks, in the order every start takes them: the key's, then the workflow id's (a start
with ``id=``), then a concurrency group's (``on_limit`` decided at start), then rows, run
before timers (as the sweep and the claim lock them):

- PostgreSQL: a transaction-scoped advisory lock on the workflow and key;
- SQLite: the process's flow-control lock, held by the caller around the transaction
  (:meth:`~.flow.FlowControl.deciding_start`); across processes, ``IMMEDIATE``
  transactions serialise every writer. Without them, the unique index of pending bursts
  keeps it to one run: a start that loses the race sees the index refuse its insert, and
  joins the other's run when it tries again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..engine.flow import Debounce, debounced_reason
from ..engine.records import RUN_LEVEL_SEQ, RunStatus, TimerKind
from ..engine.run_logging import get_logger
from ..models import Timer, WorkflowRun
from ..models.querysets import WorkflowRunQuerySet
from .intake import Intake
from .sql import StoreSql
from .statement_parts import aware

logger = get_logger("django_weft.store")


@dataclass(frozen=True)
class JoinedBurst:
    """The run a start joined: the pending run of its key."""

    run_id: str
    workflow_id: str


class DebouncedStarts:
    """Open a burst (a pending run) for a debounced start, or join the one of its key."""

    def __init__(self, sql: StoreSql, intake: Intake) -> None:
        self.sql = sql
        self.intake = intake

    def lock_key(self, workflow: str, key: str) -> None:
        """Take the lock of the key's bursts, held until the caller's transaction ends
        (PostgreSQL; on SQLite the caller holds the process's flow lock). First in the
        transaction: before the workflow id's lock and before any row lock."""
        if self.sql.is_postgres:
            with self.sql.connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 7324))", [f"{workflow}\x1f{key}"]
                )

    def pending(self, workflow: str, key: str) -> WorkflowRunQuerySet:
        """The key's burst, if it has one (at most one: a unique index says so)."""
        return self.sql.runs().filter(
            workflow_name=workflow, debounce_key=key, status=RunStatus.PENDING, slot=""
        )

    def join(
        self, workflow: str, key: str, fields: dict[str, Any], debounce: Debounce, *, timeout: float | None
    ) -> JoinedBurst | None:
        """Join the key's burst, in the caller's transaction (after :meth:`lock_key`): move
        its timer to ``period`` from now (capped by ``max_wait`` from its first start;
        never earlier than it was) and give the run this start's ``fields`` (arguments,
        search attributes, priority, keys) and its execution deadline (``timeout`` from
        now; none without one). ``None`` when the key has no burst to join, or when its
        burst's time has come (it is made runnable, and this start opens the next)."""
        found = (
            self.pending(workflow, key)
            .select_for_update()
            .values_list("pk", "workflow_id", "waiting_on", "debounced_starts", "execution_deadline")
            .first()
        )
        if found is None:
            return None
        run_pk, workflow_id, waiting_on, collapsed, had_deadline = found
        starts = (collapsed or 1) + 1
        # After the lock: later than every commit of the starts that held it before.
        now = self.sql.transition_now()
        first = _moment((waiting_on or {}).get("first_start_at")) or now
        starts_at = debounce.starts_at(first, now)
        timers = Timer.objects.using(self.sql.alias)
        run_timers = timers.filter(run_id=run_pk, seq=RUN_LEVEL_SEQ)
        current = (
            run_timers.select_for_update()
            .filter(kind=TimerKind.DELAYED_START, fired_at__isnull=True)
            .values_list("pk", "fire_at")
            .first()
        )
        if current is not None and current[1] <= now:
            # Its time came before this start (the sweep has not fired it yet): the start
            # is not part of it. Fire it as the sweep would, runnable now (the sweep sends
            # it to a worker), and let the start open a burst of its own.
            timers.filter(pk=current[0]).update(fired_at=now)
            self.sql.runs().filter(pk=run_pk).update(
                status=RunStatus.RUNNING, ready_at=now, waiting_on=None, updated_at=now
            )
            logger.info("run %s (%s %s): its debounced start was due, started by the next start",
                        run_pk, workflow, workflow_id)  # fmt: skip
            return None
        if current is not None:
            # Never earlier than a start decided before (a period shortened by a deploy).
            starts_at = max(starts_at, current[1])
            timers.filter(pk=current[0]).update(fire_at=starts_at)
        else:  # a pending burst always has its timer; put one back if it went missing
            run_timers.filter(kind=TimerKind.DELAYED_START).delete()
            timers.create(run_id=run_pk, seq=RUN_LEVEL_SEQ, kind=TimerKind.DELAYED_START, fire_at=starts_at)
        deadline = now + timedelta(seconds=timeout) if timeout is not None else None
        if deadline is None:
            if had_deadline is not None:
                run_timers.filter(kind=TimerKind.DEADLINE).delete()
        elif not run_timers.filter(kind=TimerKind.DEADLINE).update(fire_at=deadline, fired_at=None):
            timers.create(run_id=run_pk, seq=RUN_LEVEL_SEQ, kind=TimerKind.DEADLINE, fire_at=deadline)
        self.sql.runs().filter(pk=run_pk).update(
            **fields,
            execution_deadline=deadline,
            debounced_starts=starts,
            waiting_on=debounced_reason(key, starts_at, first, starts),
            updated_at=now,
        )
        logger.info("run %s (%s %s): a start joined its debounced burst (%s starts), starts at %s",
                    run_pk, workflow, workflow_id, starts, starts_at.isoformat())  # fmt: skip
        return JoinedBurst(str(run_pk), workflow_id)

    def open(
        self,
        run_id: uuid.UUID,
        workflow_id: str | None,
        fields: dict[str, Any],
        debounce: Debounce,
        *,
        timeout: float | None,
        dispatched: bool,
    ) -> tuple[WorkflowRun, datetime]:
        """Open a burst for key ``fields["debounce_key"]``: create its run, pending until
        ``period`` from now, in the caller's transaction (after :meth:`lock_key`, having
        found no burst to join). Returns the run and when it starts."""
        now = self.sql.transition_now()
        starts_at = debounce.starts_at(now, now)
        opened = {**fields, "debounced_starts": 1,
                  "waiting_on": debounced_reason(fields["debounce_key"], starts_at, now, 1)}  # fmt: skip
        run, _ = self.intake.create_run(
            run_id,
            workflow_id,
            opened,
            timeout=timeout,
            delay=debounce.period_seconds,
            dispatched=dispatched,
            now=now,
        )
        return run, starts_at


def _moment(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return aware(datetime.fromisoformat(value))
    except ValueError:
        return None
