"""Flow control in the database: concurrency slots taken, queued and handed on under a
lock of the key, so the limit holds across every process and machine
(docs/explanation/flow-control.md).

A *group* is what one limit counts: a workflow and a key (``scope="key"``), or a
workflow (``scope="workflow"``). Every decision about a group's slots (take one at a
claim, queue a run, let queued runs in after a slot frees, a start's ``on_limit``) is
made while holding the group's lock, so two of them never both see the same free slot:

- PostgreSQL: a transaction-scoped advisory lock on the group, taken before any row
  lock (the order everywhere: group, then run rows), so no decision deadlocks with
  another or with a turn;
- SQLite: one lock of the process (SQLite has one writer; flow control holds for the
  processes of one machine sharing a file only as far as that one process decides).

A slot belongs to a run, not to a worker: a run keeps it across a takeover after its
owner died (its lease expired) and gives it back by ending, when its status leaves the
active ones; nothing is counted that a crash could leak.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Collection, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Exists, Max, Min, OuterRef, Q

from ..engine.flow import Concurrency, queued_reason
from ..engine.records import ACTIVE_STATUSES, RunStatus
from ..engine.run_logging import get_logger
from .sql import StoreSql
from .statement_parts import RUN_TABLE

logger = get_logger("django_weft.store")

HELD = "held"
QUEUED = "queued"
_LIVE = sorted(ACTIVE_STATUSES)
_SQLITE_LOCK = threading.RLock()


@dataclass(frozen=True)
class Admitted:
    """A queued run let in: it holds a slot and is runnable; ring its doorbell."""

    run_id: str
    priority: int


@dataclass(frozen=True)
class ClaimAdmission:
    """What a claim of a run without a slot decided: ``admitted`` (it holds one now and
    may be claimed), and the queued runs it let in ahead of it."""

    admitted: bool
    others: tuple[Admitted, ...] = ()


WORKFLOW_GROUPS = 7322
"""The lock space (the seed of the hash) of workflow concurrency groups."""
ACTIVITY_GROUPS = 7323
"""The lock space of activity concurrency groups (:mod:`.activity_flow`)."""


_backstop_after: dict[str, tuple[str, str] | None] = {}
"""By database alias: the last queued group this process's backstop
(:meth:`FlowControl.admit_waiting`) looked at, so its next sweep goes on from there."""


@contextmanager
def group_lock(sql: StoreSql, group: str, space: int) -> Iterator[None]:
    """The transaction in which a group's slots are decided, holding the group's lock: a
    transaction-scoped advisory lock on PostgreSQL (``space`` keeps workflow and activity
    groups apart), the process's flow lock on SQLite."""
    if sql.is_postgres:
        with transaction.atomic(using=sql.alias), sql.connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, %s))", [group, space])
            yield
        return
    with _SQLITE_LOCK, transaction.atomic(using=sql.alias):
        yield


class FlowControl:
    """Concurrency slots: take one at a claim, queue a run, hand freed slots on."""

    def __init__(self, sql: StoreSql) -> None:
        self.sql = sql

    def _group(self, workflow: str, key: str) -> AbstractContextManager[None]:
        """The transaction in which a group's slots are decided, holding its lock."""
        return group_lock(self.sql, f"{workflow}\x1f{key}", WORKFLOW_GROUPS)

    def _lock(self, workflow: str, key: str) -> None:
        """Take the group's lock until the current transaction ends (PostgreSQL; on SQLite
        the caller holds the process's flow lock)."""
        if self.sql.is_postgres:
            with self.sql.connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, %s))",
                    [f"{workflow}\x1f{key}", WORKFLOW_GROUPS],
                )

    @staticmethod
    def group_key(limit: Concurrency, key: str) -> str:
        return "" if limit.per_workflow else key

    def _live(self, workflow: str, key: str, limit: Concurrency) -> Any:
        runs = self.sql.runs().filter(workflow_name=workflow, concurrency_key__isnull=False, status__in=_LIVE)
        return runs if limit.per_workflow else runs.filter(concurrency_key=key)

    def _queued(self, workflow: str, key: str, limit: Concurrency) -> Any:
        runs = self.sql.runs().filter(
            workflow_name=workflow, slot=QUEUED, status=RunStatus.PENDING, concurrency_key__isnull=False
        )
        return runs if limit.per_workflow else runs.filter(concurrency_key=key)

    def held(self, workflow: str, key: str, limit: Concurrency) -> int:
        """How many runs hold a slot of the group of ``key``."""
        return self._live(workflow, key, limit).filter(slot=HELD).count()

    def admit_on_claim(self, run_id: str, workflow: str, key: str, limit: Concurrency) -> ClaimAdmission:
        """A claim found runnable run ``run_id`` without a slot: give it one if one is free
        and no run waits before it, else queue it (status ``pending``, saying why) and let
        in the queued runs the free slots allow, best first."""
        with self._group(workflow, self.group_key(limit, key)):
            found = (
                self.sql.runs()
                .select_for_update()
                .filter(pk=run_id, status=RunStatus.RUNNING, owner_id__isnull=True)
                .exclude(slot=HELD)
                .values_list("priority", flat=True)
                .first()
            )
            if found is None:
                return ClaimAdmission(admitted=False)  # claimed, or changed, meanwhile
            held = self.held(workflow, key, limit)
            free = limit.limit - held
            queued = self._queued(workflow, key, limit)
            if free > 0 and not queued.exists():
                self.sql.runs().filter(pk=run_id).update(slot=HELD)
                return ClaimAdmission(admitted=True)
            self._enqueue(run_id, workflow, key, limit, held)
            admitted = self._let_in(workflow, key, limit, free) if free > 0 else []
        mine = str(run_id)
        return ClaimAdmission(
            admitted=any(item.run_id == mine for item in admitted),
            others=tuple(item for item in admitted if item.run_id != mine),
        )

    def _queued_fields(self, workflow: str, key: str, limit: Concurrency, held: int) -> dict[str, Any]:
        """The columns of a run queued for a slot of the group of ``key``. Its rank
        (``scope="workflow"``) is one more than the last queued run of its key, and never
        below the first queued run of the workflow: a key that arrives late waits behind
        as many runs as each other key has queued ahead of it, not behind all of them
        (round-robin, as start-time fair queueing)."""
        rank = 0
        if limit.per_workflow:
            queued = self._queued(workflow, key, limit).aggregate(
                first=Min("queue_rank"), last=Max("queue_rank", filter=Q(concurrency_key=key))
            )
            rank = max((queued["last"] if queued["last"] is not None else -1) + 1, queued["first"] or 0)
        return {
            "status": RunStatus.PENDING,
            "slot": QUEUED,
            "queue_rank": rank,
            "ready_at": None,
            "dispatched_at": None,
            "waiting_on": queued_reason(key, limit.limit, held, per_workflow=limit.per_workflow),
        }

    def _enqueue(self, run_id: str, workflow: str, key: str, limit: Concurrency, held: int) -> None:
        """Queue run ``run_id`` (:meth:`_queued_fields`)."""
        fields = self._queued_fields(workflow, key, limit, held)
        self.sql.runs().filter(pk=run_id).update(**fields, updated_at=self.sql.db_now())
        logger.info("run %s (%s): queued for a concurrency slot (%s of %s in use)",
                    run_id, workflow, held, limit.limit)  # fmt: skip

    def admit_at_start(self, workflow: str, key: str, limit: Concurrency) -> dict[str, Any]:
        """For a new run of a limited workflow, in the start's transaction (inside
        :meth:`deciding_start`): take the group's lock (held until that transaction ends)
        and return the columns to insert the run with: holding a slot if one is free and
        no run waits for one, else queued."""
        self._lock(workflow, self.group_key(limit, key))
        held = self.held(workflow, key, limit)
        if held < limit.limit and not self._queued(workflow, key, limit).exists():
            return {"slot": HELD}
        return self._queued_fields(workflow, key, limit, held)

    def _let_in(self, workflow: str, key: str, limit: Concurrency, free: int) -> list[Admitted]:
        """Let up to ``free`` queued runs of the group in: higher priority first, then by
        rank (round-robin across keys), then the oldest. Under the group's lock."""
        chosen = list(
            self._queued(workflow, key, limit)
            .select_for_update()
            .order_by("-priority", "queue_rank", "created_at")
            .values_list("pk", "priority")[:free]
        )
        if not chosen:
            return []
        now = self.sql.db_now()
        self.sql.runs().filter(pk__in=[pk for pk, _ in chosen], status=RunStatus.PENDING, slot=QUEUED).update(
            status=RunStatus.RUNNING,
            slot=HELD,
            queue_rank=None,
            ready_at=now,
            dispatched_at=None,
            waiting_on=None,
            updated_at=now,
        )
        for pk, _ in chosen:
            logger.info("run %s (%s): a concurrency slot freed, let in", pk, workflow)
        return [Admitted(str(pk), priority) for pk, priority in chosen]

    def admit_group(self, workflow: str, key: str, limit: Concurrency) -> list[Admitted]:
        """Let in as many queued runs of the group of ``key`` as it has free slots."""
        with self._group(workflow, self.group_key(limit, key)):
            if self.sql.is_postgres:
                return self._let_in_one_statement(workflow, key, limit)
            free = limit.limit - self.held(workflow, key, limit)
            return self._let_in(workflow, key, limit, free) if free > 0 else []

    def _let_in_one_statement(self, workflow: str, key: str, limit: Concurrency) -> list[Admitted]:
        """PostgreSQL, under the group's lock (taken by the statement before, so this one's
        snapshot sees every commit of the lock's previous holder): count the slots in use,
        choose that many fewer queued runs, best first, and let them in, in one statement."""
        params: dict[str, Any] = {"name": workflow, "key": key, "limit": limit.limit, "live": _LIVE}
        now = self.sql.sql_now(params)
        of_key = "" if limit.per_workflow else "AND concurrency_key = %(key)s "
        sql = (
            f"WITH chosen AS (SELECT id FROM {RUN_TABLE} WHERE workflow_name = %(name)s {of_key}"
            "AND concurrency_key IS NOT NULL AND slot = 'queued' AND status = 'pending' "
            "ORDER BY priority DESC, queue_rank, created_at "
            f"LIMIT GREATEST(%(limit)s - (SELECT count(*) FROM {RUN_TABLE} WHERE workflow_name = %(name)s "
            f"{of_key}AND concurrency_key IS NOT NULL AND status = ANY(%(live)s) AND slot = 'held'), 0) "
            f"FOR UPDATE) UPDATE {RUN_TABLE} AS run SET status = 'running', slot = 'held', "
            f"queue_rank = NULL, ready_at = {now}, dispatched_at = NULL, waiting_on = NULL, "
            f"updated_at = {now} "
            "FROM chosen WHERE run.id = chosen.id RETURNING run.id, run.priority"
        )
        with self.sql.connection.cursor() as cursor:
            cursor.execute(sql, params)
            chosen = cursor.fetchall()
        for pk, _ in chosen:
            logger.info("run %s (%s): a concurrency slot freed, let in", pk, workflow)
        return [Admitted(str(pk), priority) for pk, priority in chosen]

    def released(self, run_id: str, workflow: str, limit: Concurrency) -> list[Admitted]:
        """Run ``run_id`` of ``workflow`` ended: if runs of its group are queued, let in as
        many as the group now has room for. One indexed read when none is queued (a limit
        that is not reached costs no lock here)."""
        queued = self.sql.runs().filter(
            workflow_name=workflow, slot=QUEUED, status=RunStatus.PENDING, concurrency_key__isnull=False
        )
        if not limit.per_workflow:
            queued = queued.filter(concurrency_key=OuterRef("concurrency_key"))
        key = (
            self.sql.runs()
            .filter(pk=run_id, workflow_name=workflow, concurrency_key__isnull=False)
            .filter(Exists(queued))
            .values_list("concurrency_key", flat=True)
            .first()
        )
        return [] if key is None else self.admit_group(workflow, key, limit)

    def queued(self, workflows: Collection[str]) -> Any:
        """The runs of ``workflows`` queued for a slot, unlocked."""
        return self.sql.runs().filter(
            slot=QUEUED,
            status=RunStatus.PENDING,
            workflow_name__in=sorted(workflows),
            concurrency_key__isnull=False,
        )

    def admit_waiting(
        self, limits: Mapping[str, Concurrency], batch: int, *, unlimited: Collection[str] = ()
    ) -> list[Admitted]:
        """The sweep's backstop: for every group with queued runs (of the workflows in
        ``limits``) and a free slot, let them in. A slot freed by a run that ended without
        its ending being followed by :meth:`released` (a cancel from the admin, a timeout,
        a crash in between) is handed on here within a tick.

        ``unlimited``: workflows known here that have no limit, though runs of theirs may
        still be queued (a deploy removed the limit): those runs are let go, no longer
        counted by any limit (:meth:`drop_limit`)."""
        if not limits and not unlimited:
            return []
        groups = self._queued_groups([*limits, *unlimited], batch)
        admitted: list[Admitted] = []
        for name in sorted({name for name, _ in groups if name not in limits}):
            admitted += self.drop_limit(name, batch)
        groups = {(name, key) for name, key in groups if name in limits}
        if not groups:
            return admitted
        names = sorted({name for name, _ in groups})
        held: dict[tuple[str, str], int] = {}
        for name, key in (
            self.sql.runs()
            .filter(workflow_name__in=names, concurrency_key__isnull=False, status__in=_LIVE, slot=HELD)
            .values_list("workflow_name", "concurrency_key")
        ):
            group = (name, self.group_key(limits[name], str(key)))
            held[group] = held.get(group, 0) + 1
        for name, key in sorted({(name, self.group_key(limits[name], str(key))) for name, key in groups}):
            if held.get((name, key), 0) < limits[name].limit:
                admitted += self.admit_group(name, key, limits[name])
        return admitted

    def drop_limit(self, workflow: str, batch: int, *, run_id: str | None = None) -> list[Admitted]:
        """``workflow`` has no concurrency limit (any more): up to ``batch`` of its runs
        still queued for a slot (or ``run_id`` alone, queued or runnable without a slot)
        drop their key and are runnable as any run; returns those that were queued. A run
        already holding a slot keeps it until it ends (nothing counts it any more)."""
        runs = self.sql.runs().filter(
            Q(slot=QUEUED, status=RunStatus.PENDING) | Q(status=RunStatus.RUNNING, owner_id__isnull=True),
            workflow_name=workflow,
            concurrency_key__isnull=False,
        )
        runs = runs.exclude(slot=HELD)
        if run_id is not None:
            runs = runs.filter(pk=run_id)
        now = self.sql.now_value()
        with transaction.atomic(using=self.sql.alias):
            chosen = list(
                runs.select_for_update(skip_locked=True)
                .order_by("-priority", "queue_rank", "created_at")
                .values_list("pk", "priority", "status")[:batch]
            )
            if not chosen:
                return []
            queued = [(pk, priority) for pk, priority, status in chosen if status == RunStatus.PENDING]
            runnable = [pk for pk, _, status in chosen if status != RunStatus.PENDING]
            # Status and slot in one update: a pending run without a slot would be taken
            # for an open debounce burst (the burst's unique index).
            unkeyed = {"concurrency_key": None, "slot": "", "queue_rank": None, "updated_at": now}
            if queued:
                self.sql.runs().filter(pk__in=[pk for pk, _ in queued]).update(
                    status=RunStatus.RUNNING, ready_at=now, dispatched_at=None, waiting_on=None, **unkeyed
                )
            if runnable:
                self.sql.runs().filter(pk__in=runnable).update(**unkeyed)
        for pk, _ in queued:
            logger.info("run %s (%s): no longer queued, its workflow has no limit now", pk, workflow)
        return [Admitted(str(pk), priority) for pk, priority in queued]

    def _queued_groups(self, workflows: Collection[str], batch: int) -> set[tuple[str, str]]:
        """``batch`` of the (workflow, key) pairs with queued runs, in their order from
        where the previous call stopped, wrapping around: every group is looked at within
        a few sweeps however many groups have queued runs (the first ``batch`` of them
        every time would leave the others' freed slots unused while those stay busy)."""

        def page(after: tuple[str, str] | None, size: int) -> list[tuple[str, str]]:
            queued = self.queued(workflows)
            if after is not None:
                name, key = after
                queued = queued.filter(
                    Q(workflow_name__gt=name) | Q(workflow_name=name, concurrency_key__gt=key)
                )
            # Ordered by the group alone (not the model's -created_at), so DISTINCT is per group.
            pairs = queued.order_by("workflow_name", "concurrency_key").values_list(
                "workflow_name", "concurrency_key"
            )
            return [(str(name), str(key)) for name, key in pairs.distinct()[:size]]

        after = _backstop_after.get(self.sql.alias)
        found = page(after, batch)
        if len(found) < batch and after is not None:
            found += page(None, batch - len(found))  # wrapped around: from the first group
        _backstop_after[self.sql.alias] = found[-1] if len(found) == batch else None
        return set(found)

    @contextmanager
    def deciding_start(self) -> Iterator[None]:
        """Around the transaction of a start that calls :meth:`check_start` or
        :meth:`admit_at_start`, or collapses a debounced start
        (:class:`~.debounce.DebouncedStarts`): on SQLite, the process's flow lock
        (PostgreSQL's locks are taken inside the transaction)."""
        if self.sql.is_postgres:
            yield
            return
        with _SQLITE_LOCK:
            yield

    def check_start(self, workflow: str, key: str, limit: Concurrency) -> list[tuple[uuid.UUID, str]]:
        """For a start whose ``on_limit`` is decided at start (not ``queue``), in the
        caller's transaction (inside :meth:`deciding_start`): take the group's lock (held
        until that transaction ends) and return the live runs of the key if they fill
        its slots, oldest first, as ``(run pk, workflow id)``; an empty list if the
        start may go ahead."""
        self._lock(workflow, self.group_key(limit, key))
        live = list(self._live(workflow, key, limit).order_by("created_at").values_list("pk", "workflow_id"))
        return live if len(live) >= limit.limit else []
