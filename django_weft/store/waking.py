"""Whether a parked run needs a turn now, and waking it: the facts come from the
database, the decision from :mod:`django_weft.engine.waits`."""

from __future__ import annotations

import uuid
from typing import Any

from ..engine.records import (
    ACTIVE_STATUSES,
    PENDING_STEP_STATUSES,
    RunStatus,
    StepKind,
    StepStatus,
)
from ..models import Signal, Step, Update
from ..models.messages import UpdateStatus
from .sql import SqlStatements


class WakingMixin(SqlStatements):
    def _wait_satisfied(self, run_id: str, waiting_on: dict[str, Any] | None) -> bool:
        """Whether a parked run needs a turn now because of its queued activities: for a
        wait on ``any`` of them, one finished; for ``all``, none is pending, or an attempt
        failed or was lost (the workflow decides on the retry). An attempt that failed or
        was lost among the activities started but not waited for (``background``) counts
        too, whatever the run waits for."""
        if not waiting_on:
            return False
        if self._messages_waiting(run_id, waiting_on):
            return True
        waiting_for_activities = waiting_on.get("kind") == "activities"
        seqs = list(waiting_on.get("seqs") or []) if waiting_for_activities else []
        background = list(waiting_on.get("background") or [])
        if not seqs and not background:
            return False
        key = uuid.UUID(str(run_id))
        rows = list(
            Step.objects.using(self.alias)
            .filter(run_id=key, seq__in=seqs + background)
            .values_list("seq", "status", "kind")
        )
        status_of = {seq: status for seq, status, _ in rows}
        children = [
            seq for seq, status, kind in rows if kind == StepKind.CHILD and status == StepStatus.WAITING
        ]
        if children:
            # A child step stays "waiting" until the parent records the outcome; what
            # counts is whether the child run (or its continued-as-new successor) is live.
            live = set(
                self._runs()
                .filter(parent_id=key, parent_seq__in=children, status__in=list(ACTIVE_STATUSES))
                .values_list("parent_seq", flat=True)
            )
            for seq in children:
                status_of[seq] = StepStatus.SCHEDULED if seq in live else StepStatus.COMPLETED
        needs_decision = (StepStatus.ATTEMPT_FAILED, StepStatus.LOST)
        if any(status_of.get(seq) in needs_decision for seq in background):
            return True
        if not waiting_for_activities:
            return False
        pending = [status_of.get(seq) in PENDING_STEP_STATUSES for seq in seqs]
        if waiting_on.get("mode") == "any":
            return not all(pending)
        return not any(pending) or any(status_of.get(seq) in needs_decision for seq in seqs)

    def _messages_waiting(self, run_id: str, waiting_on: dict[str, Any]) -> bool:
        """Whether a signal or an update that wakes the run (``waiting_on["signals"]``,
        ``["updates"]``: the names it waits for or handles) is pending."""
        key = uuid.UUID(str(run_id))
        signals: list[str] = waiting_on.get("signals") or []
        updates: list[str] = waiting_on.get("updates") or []
        if signals and (
            Signal.objects.using(self.alias)
            .filter(run_id=key, name__in=signals, consumed_seq__isnull=True)
            .exists()
        ):
            return True
        return bool(updates) and (
            Update.objects.using(self.alias)
            .filter(run_id=key, name__in=updates, status=UpdateStatus.ACCEPTED, applied_seq__isnull=True)
            .exists()
        )

    def _wake_parent(self, parent_pk: Any) -> str | None:
        """After a child's terminal write (in its transaction): make the parent runnable if
        it is parked waiting for what just happened. Returns the parent's id if woken."""
        parent = self._runs().select_for_update().filter(pk=parent_pk).values("status", "waiting_on").first()
        if parent is None or parent["status"] != RunStatus.WAITING:
            return None
        if not self._wait_satisfied(str(parent_pk), parent["waiting_on"]):
            return None
        now = self.db_now()
        self._runs().filter(pk=parent_pk).update(
            status=RunStatus.RUNNING, ready_at=now, waiting_on=None, dispatched_at=None, updated_at=now
        )
        return str(parent_pk)
