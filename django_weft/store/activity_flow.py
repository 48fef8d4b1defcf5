"""Flow control of activity attempts in the database: rate limit buckets advanced in one
statement, and activity concurrency slots taken, queued and handed on under a lock of
their key (docs/explanation/flow-control.md, "Rate limits" and "Activity slots").

A rate limit bucket is one row: the moment its next attempt is due (a generic cell rate
algorithm, :func:`~django_weft.engine.flow.gcra_take`). One ``INSERT ... ON CONFLICT DO
UPDATE ... RETURNING`` takes an attempt's moment: the row lock serialises the attempts
of every process, and each gets a moment of its own, now or later.

An activity slot is a row per attempt position: ``held`` while the attempt executes (a
lease, renewed by its worker's heartbeat, so the slot of a worker that died comes free
when the lease runs out) or ``waiting`` for one. Decisions about a group (an activity and
a key) are made under the group's lock (:func:`~.flow.group_lock`), taken before any
run row; a slot handed on to a waiting attempt wakes its run afterwards, in a
transaction of its own that locks the run row. On PostgreSQL the common decisions (a
free slot taken when nobody waits, a slot given back) are one call each of a function
of migration ``0029`` that takes the same lock.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import Count, Min, Q

from ..engine.flow import Concurrency, Rate, SlotTaken, from_micros, gcra_moment, to_micros
from ..engine.records import ACTIVE_STATUSES, RunStatus, StepStatus, TimerKind
from ..engine.run_logging import get_logger
from ..models import ActivitySlot, RateLimitBucket, Step, Timer
from .flow import _SQLITE_LOCK, ACTIVITY_GROUPS, group_lock
from .sql import StoreSql
from .statement_parts import aware

logger = get_logger("django_weft.store")

HELD = ActivitySlot.State.HELD
WAITING = ActivitySlot.State.WAITING
_LIVE = sorted(ACTIVE_STATUSES)
_BUCKET_TABLE = RateLimitBucket._meta.db_table
_SLOT_TABLE = ActivitySlot._meta.db_table


def _group_name(activity: str, key: str) -> str:
    """The name of the group ``(activity, key)`` its lock is taken by."""
    return f"{activity}\x1f{key}"


_TAKE_FREE_SIGNATURE = (
    "weft_take_free_slot(text, integer, text, text, integer, uuid, integer, double precision, text, "
    "timestamptz)"
)
_GIVE_BACK_SIGNATURE = "weft_give_slot_back(text, integer, text, text, uuid, integer, text, boolean)"
_HAS_SLOT_FUNCTIONS: weakref.WeakSet[Any] = weakref.WeakSet()
"""The psycopg connections whose database has both slot functions (migration ``0029``)."""
_WARNED: weakref.WeakSet[Any] = weakref.WeakSet()
"""The psycopg connections whose database was found without them (warned once)."""

_GROUP_ARGS = "%(group)s::text, %(space)s::integer, %(activity)s::text, %(key)s::text"
"""The arguments of a group that both slot functions take first."""


def _group_params(activity: str, key: str) -> dict[str, Any]:
    return {"group": _group_name(activity, key), "space": ACTIVITY_GROUPS, "activity": activity, "key": key}


class ActivityFlow:
    """Rate limit buckets and activity concurrency slots."""

    def __init__(self, sql: StoreSql) -> None:
        self.sql = sql

    # -- rate limits ---------------------------------------------------------------------

    def take_moment(self, name: str, key: str, rate: Rate) -> datetime | None:
        """Take the next moment of the bucket ``(name, key)`` at ``rate``: ``None`` if the
        attempt may go now, else the moment it may go (its own: the bucket has moved past
        it). One statement (:meth:`grant`)."""
        moment, now = self.grant(name, key, rate)
        return None if moment <= now else moment

    def grant(self, name: str, key: str, rate: Rate) -> tuple[datetime, datetime]:
        """Take the next moment of the bucket ``(name, key)``: ``(its moment, now)``, the
        moment no earlier than now. One statement; concurrent callers in any process
        queue on the row's lock, each getting a moment of its own.

        The time is read in the statement, after the row lock (``clock_timestamp()`` on
        PostgreSQL; SQLite's statement runs in a transaction that holds the database's
        write lock before the time is read), so a caller that waited for the lock does
        not take a moment in the past."""
        quote = self.sql.connection.ops.quote_name
        params: dict[str, Any] = {"name": name, "key": key, "interval": rate.interval_us}
        if self.sql.clock_in_sql:
            clock = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS bigint)"
        else:
            clock = "%(now)s"
        greatest = "GREATEST" if self.sql.is_postgres else "MAX"
        prefix = ""
        source = f"VALUES (%(name)s, %(key)s, {clock} + %(interval)s)"
        if self.sql.is_postgres and self._own_transaction():
            # Its own transaction, committed without waiting for the WAL flush: a bucket
            # paces, it records nothing (docs/explanation/flow-control.md says what a crash
            # of the database forgets). The setting is read at the commit, at the end of
            # this statement.
            prefix = "WITH unhurried AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true)) "
            source = f"SELECT %(name)s, %(key)s, {clock} + %(interval)s FROM unhurried"
        statement = (
            f"{prefix}INSERT INTO {_BUCKET_TABLE} (name, {quote('key')}, tat) {source} "
            f"ON CONFLICT (name, {quote('key')}) DO UPDATE "
            f"SET tat = {greatest}({_BUCKET_TABLE}.tat, {clock}) + %(interval)s "
            f"RETURNING tat, {clock}"
        )
        if self.sql.is_postgres:
            if not self.sql.clock_in_sql:
                params["now"] = to_micros(self.sql.local_now())
            row = self.sql.fetch_prepared(statement, params)  # once per attempt: prepared
            assert row is not None
            tat, now = row
        else:
            # IMMEDIATE transactions take the write lock at BEGIN: the time is read after it.
            with (
                _SQLITE_LOCK,
                transaction.atomic(using=self.sql.alias),
                self.sql.connection.cursor() as cursor,
            ):
                params["now"] = to_micros(self.sql.local_now())
                cursor.execute(statement, params)
                tat, now = cursor.fetchone()
        # The bucket moved one interval past the moment it gave: when it was idle, the
        # time the statement read after the row lock, else the moment it held.
        return from_micros(gcra_moment(int(tat), rate)), from_micros(int(now))

    def forget_idle_buckets(self, idle_for: float) -> int:
        """Delete the buckets whose next moment is more than ``idle_for`` seconds past:
        an idle bucket gives the next attempt the same moment as no bucket (now), so this
        only keeps the table to the names and keys in use. A take racing the delete
        either finds no row and inserts one, or holds the row's lock, and the delete then
        reads its new ``tat`` and keeps it. Returns how many were deleted."""
        cutoff = to_micros(self.sql.db_now()) - round(idle_for * 1_000_000)
        deleted, _ = RateLimitBucket.objects.using(self.sql.alias).filter(tat__lt=cutoff).delete()
        return deleted

    def busy_buckets(self, now: datetime, top: int) -> list[tuple[str, str, int]]:
        """The ``top`` buckets whose next moment is after ``now``, the furthest first:
        ``(name, key, tat)``. A backward scan of the index on ``tat`` that stops at the
        ``top``-th row, however many buckets there are."""
        return list(
            RateLimitBucket.objects.using(self.sql.alias)
            .filter(tat__gt=to_micros(now))
            .order_by("-tat", "pk")
            .values_list("name", "key", "tat")[: max(int(top), 0)]
        )

    # -- concurrency slots ---------------------------------------------------------------

    def busiest_groups(self, now: datetime, top: int) -> list[dict[str, Any]]:
        """The ``top`` groups ``(activity, key)`` with the most attempts waiting, then the
        most slots held (leases running at ``now``), then by activity and key: dicts of
        ``activity``, ``key``, ``held``, ``waiting`` and ``oldest`` (when the attempt
        waiting longest was queued). One grouped query; the table holds only attempts
        that hold or wait for a slot (an attempt's row goes when it gives its slot back),
        so it reads those and nothing else. Held slots whose lease ran out are left out,
        as :meth:`take_slot` counts them free."""
        held = Q(state=HELD, lease_expires_at__gt=now)
        waiting = Q(state=WAITING)
        return list(
            self._slots()
            .filter(held | waiting)
            .order_by()
            .values("activity", "key")
            .annotate(
                held=Count("pk", filter=held),
                waiting=Count("pk", filter=waiting),
                oldest=Min("created_at", filter=waiting),
            )
            .order_by("-waiting", "-held", "activity", "key")[: max(int(top), 0)]
        )

    def _slots(self) -> Any:
        return ActivitySlot.objects.using(self.sql.alias)

    def take_slot(
        self, activity: str, key: str, limit: int, run_id: str, seq: int, ttl: float, holder: str
    ) -> SlotTaken:
        """Take a slot of the group ``(activity, key)`` for the execution ``holder`` of the
        attempt at ``(run_id, seq)``: one handed on to it, or a free one when no attempt
        waits before it; else queue it (or leave it queued, in its place). Slots whose
        lease ran out are free.

        A slot at this position that another execution holds (an earlier one, still
        running after its run was taken over) is not shared: this one waits, without a
        place in the queue, and looks again when its hold is over."""
        run_pk = uuid.UUID(str(run_id))
        if self._has_slot_functions():
            in_use = self._take_free(activity, key, limit, run_pk, seq, ttl, holder)
            if in_use is not None:
                return SlotTaken(held=True, in_use=in_use)
        with self._group(activity, key) as now:
            until = now + timedelta(seconds=ttl)
            group = self._slots().filter(activity=activity, key=key)
            in_use, waiting, mine = self._look(activity, key, now, run_pk, seq)
            if mine is not None and (mine["activity"], mine["key"]) != (activity, key):
                self._slots().filter(pk=mine["pk"]).delete()  # another activity at this position (a reset)
                mine = None
            if mine is not None and mine["state"] == HELD and mine["lease_expires_at"] > now:
                if mine["holder"] not in ("", holder):
                    logger.info("run %s: activity %s (position %s) waits for an earlier execution of it "
                                "to give its concurrency slot back", run_id, activity, seq)  # fmt: skip
                    return SlotTaken(held=False, in_use=in_use)
                # Unless a worker holding a queued attempt took the slot up meanwhile (without
                # this lock: :meth:`~.attempts.ActivityAttempts.hold_activity`).
                taken = self._as_read(mine).update(holder=holder, lease_expires_at=until)
                return SlotTaken(held=bool(taken), in_use=in_use)
            queued = mine is not None and mine["state"] == WAITING
            ahead = False
            if waiting > (1 if queued else 0):  # others wait: is one of them before it?
                before = group.filter(state=WAITING, run__status__in=_LIVE)
                if queued:
                    assert mine is not None
                    before = before.filter(
                        Q(created_at__lt=mine["created_at"])
                        | Q(created_at=mine["created_at"], pk__lt=mine["pk"])
                    )
                ahead = before.exists()
            if in_use < limit and not ahead:
                if mine is not None:
                    if not self._as_read(mine).update(state=HELD, holder=holder, lease_expires_at=until):
                        return SlotTaken(held=False, in_use=in_use)
                else:
                    self._slots().create(
                        activity=activity, key=key, run_id=run_pk, seq=seq, state=HELD, holder=holder,
                        lease_expires_at=until, created_at=now,
                    )  # fmt: skip
                return SlotTaken(held=True, in_use=in_use + 1)
            if not queued:
                if mine is not None:  # a slot of its own whose lease ran out: it waits anew
                    self._as_read(mine).update(
                        state=WAITING, holder="", lease_expires_at=None, created_at=now
                    )
                else:
                    self._slots().create(
                        activity=activity, key=key, run_id=run_pk, seq=seq, state=WAITING, created_at=now
                    )
                logger.info("run %s: activity %s (position %s) queued for a concurrency slot "
                            "(%s of %s in use)", run_id, activity, seq, in_use, limit)  # fmt: skip
            return SlotTaken(held=False, in_use=in_use)

    def _as_read(self, mine: dict[str, Any]) -> Any:
        """The attempt's row, if its holder is still the one read."""
        return self._slots().filter(pk=mine["pk"], holder=mine["holder"])

    def release_slot(
        self, activity: str, key: str, limit: int, run_id: str, seq: int, ttl: float, holder: str | None
    ) -> list[str]:
        """The execution ``holder`` of the attempt at ``(run_id, seq)`` gives its slot
        back, or (``holder=None``) the attempt gives up its place in the queue, or the
        slot handed on to it and not yet taken up: the free slots go to the attempts
        queued first, whose runs are woken. A slot another execution holds stays its own.
        Returns the ids of the woken runs, to ring their doorbells."""
        run_pk = uuid.UUID(str(run_id))
        if self._has_slot_functions():
            # Only a give-back in a transaction of its own is committed once it returns.
            committed = self._own_transaction()
            if not self._give_back(activity, key, run_pk, seq, holder or ""):
                return []
            # Attempts wait: the free slots are handed on in a decision of their own. A
            # take in between sees them waiting and queues behind them.
            try:
                with self._group(activity, key) as now:
                    handed = self._hand_on(activity, key, limit, ttl, now)
            except DatabaseError:
                if not committed:
                    raise  # the caller's transaction decides whether the give-back stands
                # The slot is back; the attempts waiting for it are not lost either.
                logger.warning("run %s: gave back the concurrency slot of activity %s but could not hand it "
                               "on; the sweep hands it on", run_id, activity, exc_info=True)  # fmt: skip
                return []
            return self._wake(handed)
        with self._group(activity, key) as now:
            self._slots().filter(run_id=run_pk, seq=seq, holder=holder or "").delete()
            handed = self._hand_on(activity, key, limit, ttl, now)
        return self._wake(handed)

    def _own_transaction(self) -> bool:
        """Whether a statement now is a transaction of its own (autocommit, no atomic
        block): only then may it commit without waiting for the WAL flush, as that
        setting holds for the whole transaction it is set in."""
        connection = self.sql.connection
        return bool(connection.get_autocommit() and not connection.in_atomic_block)

    def _has_slot_functions(self) -> bool:
        """Whether this PostgreSQL connection's database has migration ``0029``'s slot
        functions. Without them (the migration not applied yet, a test database made
        without migrations) every decision takes the longer path, as before it. Asked
        once per connection once they are there, and on every decision until then."""
        if not self.sql.is_postgres:
            return False
        self.sql.connection.ensure_connection()
        raw = self.sql.connection.connection
        if raw in _HAS_SLOT_FUNCTIONS:
            return True
        with self.sql.connection.cursor() as cursor:
            cursor.execute(
                "SELECT to_regprocedure(%s) IS NOT NULL AND to_regprocedure(%s) IS NOT NULL",
                [_TAKE_FREE_SIGNATURE, _GIVE_BACK_SIGNATURE],
            )
            present = bool(cursor.fetchone()[0])
        if present:
            _HAS_SLOT_FUNCTIONS.add(raw)
        elif raw not in _WARNED:
            _WARNED.add(raw)
            logger.warning("the activity slot functions of migration 0029 are missing on database %s: "
                           "slots are decided in several statements (run manage.py migrate)",
                           self.sql.alias)  # fmt: skip
        return present

    def _take_free(
        self, activity: str, key: str, limit: int, run_pk: uuid.UUID, seq: int, ttl: float, holder: str
    ) -> int | None:
        """On PostgreSQL, in one round trip under the group's lock (migration ``0029``'s
        function): a slot for the attempt when it has no row of its own, nobody waits in
        the group and one is free; how many are then in use, else ``None`` (undecided:
        :meth:`take_slot` decides under the lock)."""
        row = self.sql.fetch_prepared(
            f"SELECT weft_take_free_slot({_GROUP_ARGS}, %(limit)s::integer, %(run)s::uuid, %(seq)s::integer, "
            "%(ttl)s::double precision, %(holder)s::text, %(now)s::timestamptz)",
            {
                **_group_params(activity, key), "limit": limit, "run": run_pk, "seq": seq, "ttl": float(ttl),
                "holder": holder, "now": None if self.sql.clock_in_sql else self.sql.local_now(),
            },
        )  # fmt: skip
        assert row is not None
        return None if row[0] is None else int(row[0])

    def _give_back(self, activity: str, key: str, run_pk: uuid.UUID, seq: int, holder: str) -> bool:
        """On PostgreSQL, in one round trip under the group's lock (migration ``0029``'s
        function): delete the row of ``holder`` at ``(run_pk, seq)``; whether attempts
        wait in the group. In a transaction of its own it commits without waiting for the
        WAL flush: a slot given back that a crash of the database forgets stays taken
        until its lease runs out, which lets fewer attempts run, never more
        (docs/explanation/flow-control.md)."""
        row = self.sql.fetch_prepared(
            f"SELECT weft_give_slot_back({_GROUP_ARGS}, %(run)s::uuid, %(seq)s::integer, %(holder)s::text, "
            "%(unhurried)s::boolean)",
            {
                **_group_params(activity, key), "run": run_pk, "seq": seq, "holder": holder,
                "unhurried": self._own_transaction(),
            },
        )  # fmt: skip
        assert row is not None
        return bool(row[0])

    def _look(
        self, activity: str, key: str, now: datetime, run_pk: uuid.UUID | None = None, seq: int = 0
    ) -> tuple[int, int, dict[str, Any] | None]:
        """In one statement: how many slots of the group are held (leases running) and
        how many attempts wait, and the row of the attempt at ``(run_pk, seq)``."""
        quote = self.sql.connection.ops.quote_name
        group = f"activity = %(activity)s AND {quote('key')} = %(key)s"
        with self.sql.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT (SELECT COUNT(*) FROM {_SLOT_TABLE} WHERE {group} AND state = %(held)s "
                f"AND lease_expires_at > %(now)s), "
                f"(SELECT COUNT(*) FROM {_SLOT_TABLE} WHERE {group} AND state = %(waiting)s), "
                f"mine.id, mine.activity, mine.{quote('key')}, mine.state, mine.holder, "
                "mine.lease_expires_at, mine.created_at "
                f"FROM (SELECT 1 AS one) AS one LEFT JOIN {_SLOT_TABLE} AS mine "
                "ON mine.run_id = %(run)s AND mine.seq = %(seq)s",
                {
                    "activity": activity, "key": key, "held": HELD, "waiting": WAITING,
                    "now": self.sql.dt(now), "run": self.sql.run_key(run_pk) if run_pk else None, "seq": seq,
                },
            )  # fmt: skip
            in_use, waiting, pk, *row = cursor.fetchone()
        mine = None
        if pk is not None:
            found_activity, found_key, state, holder, lease, created = row
            mine = {
                "pk": pk, "activity": found_activity, "key": found_key, "state": state, "holder": holder,
                "lease_expires_at": aware(lease) if lease is not None else None, "created_at": aware(created),
            }  # fmt: skip
        return int(in_use), int(waiting), mine

    @contextmanager
    def _group(self, activity: str, key: str) -> Iterator[datetime]:
        """The transaction deciding the slots of the group ``(activity, key)``, holding its
        lock (:func:`~.flow.group_lock`); yields the time read after the lock. It commits
        as every other transaction does (flushed): a slot forgotten by a database crash
        would let one more attempt run than the limit (docs/explanation/flow-control.md)."""
        group = _group_name(activity, key)
        if not self.sql.is_postgres:
            with group_lock(self.sql, group, ACTIVITY_GROUPS):
                yield self.sql.local_now()
            return
        with transaction.atomic(using=self.sql.alias), self.sql.connection.cursor() as cursor:
            # The lock first (a subquery of the FROM), then the time: after every commit of
            # the group's previous decision.
            cursor.execute(
                "SELECT clock_timestamp() FROM (SELECT pg_advisory_xact_lock(hashtextextended(%s, %s))) "
                "AS locked",
                [group, ACTIVITY_GROUPS],
            )
            now = aware(cursor.fetchone()[0])
            yield now if self.sql.clock_in_sql else self.sql.local_now()

    def _hand_on(
        self, activity: str, key: str, limit: int, ttl: float, now: datetime
    ) -> list[tuple[uuid.UUID, int]]:
        """Under the group's lock: hand the group's free slots to the attempts queued
        first, oldest first (the queued attempts of runs that ended leave the queue, and
        slots whose lease ran out go)."""
        in_use, waiting, _ = self._look(activity, key, now)
        free = limit - in_use
        if free <= 0 or not waiting:
            return []
        group = self._slots().filter(activity=activity, key=key)
        group.filter(state=HELD, lease_expires_at__lte=now).delete()
        group.filter(state=WAITING).exclude(run__status__in=_LIVE).delete()
        chosen = list(
            group.filter(state=WAITING).order_by("created_at", "pk").values_list("pk", "run_id", "seq")[:free]
        )
        if chosen:
            self._slots().filter(pk__in=[pk for pk, _, _ in chosen]).update(
                state=HELD, holder="", lease_expires_at=now + timedelta(seconds=ttl)
            )
        for _, run, seq in chosen:
            logger.info("run %s: activity %s (position %s) handed a concurrency slot", run, activity, seq)
        return [(run, seq) for _, run, seq in chosen]

    def _wake(self, handed: Iterable[tuple[uuid.UUID, int]]) -> list[str]:
        """Wake the runs of attempts a slot was handed on to: their ``delayed`` step's hold
        ends now and its timer is due. One transaction per run, after the group's lock
        was released (a run row is never locked before a group's lock). An attempt that
        is not ``delayed`` is on its way and finds the slot when it asks for one."""
        woken = []
        for run_pk, seq in handed:
            with transaction.atomic(using=self.sql.alias):
                status = (
                    self.sql.runs()
                    .select_for_update()
                    .filter(pk=run_pk)
                    .values_list("status", flat=True)
                    .first()
                )
                if status not in ACTIVE_STATUSES:
                    continue
                steps = Step.objects.using(self.sql.alias).filter(
                    run_id=run_pk, seq=seq, status=StepStatus.DELAYED
                )
                result = steps.values_list("result", flat=True).first()
                if result is None:
                    continue
                now = self.sql.db_now()
                steps.update(result={**result, "until": now.isoformat()}, updated_at=now)
                Timer.objects.using(self.sql.alias).filter(
                    run_id=run_pk, seq=seq, kind=TimerKind.RETRY
                ).update(fire_at=now, fired_at=None)
                if status == RunStatus.WAITING:
                    woken.append(str(run_pk))
        return woken

    def waiting(self, limits: Mapping[str, Concurrency]) -> Any:
        """The attempts of the activities in ``limits`` queued for a slot, unlocked."""
        return self._slots().filter(state=WAITING, activity__in=sorted(limits))

    def hand_on_waiting(self, limits: Mapping[str, Concurrency], ttl: float, batch: int) -> list[str]:
        """The sweep's backstop: for every group with queued attempts (of the activities
        in ``limits``) and a free slot, hand the free slots on. A slot freed without its
        release (a worker that died: its lease ran out; a release that failed) is handed
        on here within a tick. Returns the woken runs."""
        if not limits:
            return []
        groups = list(self.waiting(limits).values_list("activity", "key").distinct()[:batch])
        if not groups:
            return []
        now = self.sql.db_now()
        in_use: dict[tuple[str, str], int] = {}
        for activity, key in (
            self._slots()
            .filter(state=HELD, lease_expires_at__gt=now, activity__in=sorted({a for a, _ in groups}))
            .values_list("activity", "key")
        ):
            in_use[(activity, key)] = in_use.get((activity, key), 0) + 1
        woken: list[str] = []
        for activity, key in sorted(set(groups)):
            limit = limits[activity].limit
            if in_use.get((activity, key), 0) < limit:
                with self._group(activity, key) as locked_at:
                    handed = self._hand_on(activity, key, limit, ttl, locked_at)
                woken += self._wake(handed)
        return woken

    def renew_slots(self, holders: Iterable[tuple[str, int, str]], ttl: float) -> None:
        """Extend the leases of the slots the executions ``(run_id, seq, holder)`` hold."""
        condition = Q()
        for run_id, seq, holder in holders:
            condition |= Q(run_id=uuid.UUID(str(run_id)), seq=seq, holder=holder)
        if not condition:
            return
        until = self.sql.db_now() + timedelta(seconds=ttl)
        self._slots().filter(condition, state=HELD).update(lease_expires_at=until)

    def slot_held(self, run_id: str, seq: int) -> bool:
        """Whether a slot was handed on to the attempt at ``(run_id, seq)`` and not yet
        taken up by an execution of it."""
        return self._slots().filter(run_id=uuid.UUID(str(run_id)), seq=seq, state=HELD, holder="").exists()
