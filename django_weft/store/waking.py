"""Whether a parked run needs a turn now, and waking it: the facts come from the
database, the decision from :mod:`django_weft.engine.parking`."""

from __future__ import annotations

import uuid
from typing import Any

from ..engine.flow import hold_is_due
from ..engine.parking import ParkedWait, children_to_check
from ..engine.records import (
    ACTIVE_STATUSES,
    RunStatus,
    StepStatus,
)
from ..models import ActivitySlot, Signal, Step, Update
from ..models.messages import UpdateStatus
from .sql import StoreSql


class Waking:
    """The facts a wait decision needs, and waking a parent its child's end satisfies:
    held by the areas that wake runs (turns, queued attempts, transitions, the sweep)."""

    def __init__(self, sql: StoreSql) -> None:
        self.sql = sql

    def wait_satisfied(self, run_id: str, waiting_on: dict[str, Any] | None) -> bool:
        """Whether a parked run needs a turn now: a message it waits for or handles is
        pending, or (decided by :meth:`ParkedWait.satisfied_by`) its queued activities or
        children are done with, or an activity attempt flow control held is to go on (a
        ``delayed`` step whose hold is over, a concurrency slot handed on to the inline
        attempt it waits for). Reads only what the decision needs."""
        if not waiting_on:
            return False
        wait = ParkedWait.of(waiting_on)
        if self._messages_waiting(run_id, wait):
            return True
        key = uuid.UUID(str(run_id))
        if wait.slot_at is not None:
            # An inline attempt queued for a concurrency slot: one handed on to it
            # (possibly while its turn was parking) is what it waits for.
            return (
                ActivitySlot.objects.using(self.sql.alias)
                .filter(run_id=key, seq=wait.slot_at, state=ActivitySlot.State.HELD, holder="")
                .exists()
            )
        if not wait.step_seqs:
            return False
        found = list(
            Step.objects.using(self.sql.alias)
            .filter(run_id=key, seq__in=wait.step_seqs)
            .values_list("seq", "status", "kind", "result")
        )
        rows = [(seq, status, kind) for seq, status, kind, _ in found]
        held = [(seq, result) for seq, status, _, result in found if status == StepStatus.DELAYED]
        due: set[int] = set()
        if held:
            now = self.sql.db_now()
            due = {seq for seq, result in held if hold_is_due(result, now)}
        children = children_to_check(rows)
        live: set[int] = set()
        if children:
            live = {
                seq
                for seq in self.sql.runs()
                .filter(parent_id=key, parent_seq__in=children, status__in=list(ACTIVE_STATUSES))
                .values_list("parent_seq", flat=True)
                if seq is not None
            }
        return wait.satisfied_by(rows, live, due)

    def _messages_waiting(self, run_id: str, wait: ParkedWait) -> bool:
        """Whether a signal or an update that wakes the run (``wait.signals``,
        ``wait.updates``: the names it waits for or handles) is pending."""
        key = uuid.UUID(str(run_id))
        signals = list(wait.signals)
        updates = list(wait.updates)
        if signals and (
            Signal.objects.using(self.sql.alias)
            .filter(run_id=key, name__in=signals, consumed_seq__isnull=True)
            .exists()
        ):
            return True
        return bool(updates) and (
            Update.objects.using(self.sql.alias)
            .filter(run_id=key, name__in=updates, status=UpdateStatus.ACCEPTED, applied_seq__isnull=True)
            .exists()
        )

    def wake_parent(self, parent_pk: uuid.UUID | str) -> str | None:
        """After a child's terminal write (in its transaction): make the parent runnable if
        it is parked waiting for what just happened. Returns the parent's id if woken."""
        parent = (
            self.sql.runs().select_for_update().filter(pk=parent_pk).values("status", "waiting_on").first()
        )
        if parent is None or parent["status"] != RunStatus.WAITING:
            return None
        if not self.wait_satisfied(str(parent_pk), parent["waiting_on"]):
            return None
        now = self.sql.db_now()
        self.sql.runs().filter(pk=parent_pk).update(
            status=RunStatus.RUNNING, ready_at=now, waiting_on=None, dispatched_at=None, updated_at=now
        )
        return str(parent_pk)
