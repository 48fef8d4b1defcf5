"""Child workflows: the fenced start of a child, its outcome as the parent sees it, and
the parent-close policy applied to the children of a closed run."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import IntegrityError, transaction

from .. import signals
from ..engine import codec
from ..engine.error_types import ErrorType
from ..engine.errors import (
    WorkflowAlreadyExists,
    WorkflowNotFound,
    WorkflowTerminalError,
)
from ..engine.records import (
    ACTIVE_STATUSES,
    CancelRequest,
    ChildOutcome,
    ChildStart,
    RunStatus,
    StepWrite,
)
from ..engine.registry import registry
from .sql import StoreSql
from .transitions import RunTransitions


class Children:
    """Child runs: started under the parent's fence, closed by its close policy (a cancel,
    or a cancellation request, each). Held by the turns (the engine's port) and the sweep."""

    def __init__(self, sql: StoreSql, transitions: RunTransitions) -> None:
        self.sql = sql
        self.transitions = transitions

    @staticmethod
    def _flow_fields(child: ChildStart) -> dict[str, Any]:
        """A child's flow control: its parent's priority (the engine read it with the
        claim), and its key if its workflow has a concurrency limit (computed from its
        arguments, as a start's)."""
        fields: dict[str, Any] = {"priority": child.priority}
        definition = registry.workflows.get(child.workflow_name)
        if definition is not None and definition.concurrency is not None:
            fields["concurrency_key"] = definition.concurrency.key_of(
                child.workflow_name, codec.loads(child.args_json), codec.loads(child.kwargs_json)
            )
        return fields

    def start_child(self, run_id: str, owner: str, epoch: int, step: StepWrite, child: ChildStart) -> None:
        """Record the parent's child step and create the child run, in one fenced
        transaction. Raises ``WorkflowAlreadyExists`` (writing nothing) if a live run has
        the child's workflow id."""
        with transaction.atomic(using=self.sql.alias):
            with self.sql.connection.cursor() as cursor:
                self.sql.write_step(cursor, run_id, owner, epoch, step)
            now = self.sql.db_now()
            try:
                with transaction.atomic(using=self.sql.alias):
                    self.sql.runs().create(
                        id=uuid.UUID(child.run_id),
                        workflow_id=child.workflow_id,
                        workflow_name=child.workflow_name,
                        workflow_version=child.workflow_version,
                        status=RunStatus.RUNNING,
                        args=codec.loads(child.args_json),
                        kwargs=codec.loads(child.kwargs_json),
                        parent_id=uuid.UUID(str(run_id)),
                        parent_seq=step.seq,
                        parent_close_policy=child.parent_close_policy,
                        ready_at=now,
                        trace_context=child.trace_context,
                        **self._flow_fields(child),
                    )
            except IntegrityError:
                raise WorkflowAlreadyExists(
                    f"a live run with workflow id {child.workflow_id!r} exists; a child workflow needs an "
                    "id of its own (pass id=... to ctx.start_child)",
                    workflow_id=child.workflow_id,
                ) from None
            self.sql.announce(signals.run_started, child.run_id, child.workflow_id, child.workflow_name)

    def child_outcome(self, run_id: str, seq: int) -> ChildOutcome | None:
        """How the child started at ``seq`` ended, or ``None`` while it (or the run it
        continued as) is live."""
        # A continue-as-new chain has one run that is not ``continued``: its last.
        latest = (
            self.sql.runs()
            .filter(parent_id=uuid.UUID(str(run_id)), parent_seq=seq)
            .exclude(status=RunStatus.CONTINUED)
            .order_by("-created_at")
            .values("pk", "workflow_id", "status", "result", "error")
            .first()
        )
        if latest is None:
            if self.sql.runs().filter(parent_id=uuid.UUID(str(run_id)), parent_seq=seq).exists():
                return None  # only continued runs: the successor's row is not visible yet
            return ChildOutcome("", "", RunStatus.FAILED, error={"type": ErrorType.CHILD_GONE,
                                "message": "the child run no longer exists (purged)"})  # fmt: skip
        if latest["status"] in ACTIVE_STATUSES:
            return None
        return ChildOutcome(
            str(latest["pk"]), latest["workflow_id"], latest["status"], latest["result"], latest["error"]
        )

    def close_children(self, run_id: str, reason: str) -> list[str]:
        """Apply the parent-close policy to the live children of a closed run, each in a
        transaction of its own, after the parent's: cancel those with "terminate" (and
        theirs in turn), send a cancellation request to those with "request_cancel" (they
        receive it at a blocking point, and close their own children when they finish).
        A child already sent its parent's request is left alone. Returns the ids of the
        children cancelled or sent a request; a caller rings the doorbells of the latter
        (the sweep dispatches them anyway)."""
        closed: list[str] = []
        children = list(
            self.sql.runs()
            .filter(parent_id=uuid.UUID(str(run_id)), status__in=list(ACTIVE_STATUSES))
            .exclude(parent_close_policy="abandon")
            .values_list("pk", "parent_close_policy", "cancel_request")
        )
        for child, policy, stored in children:
            request = CancelRequest.of(stored)
            if policy == "request_cancel" and request is not None and request.from_parent:
                continue  # sent already (by the closing process, or an earlier sweep)
            try:
                with transaction.atomic(using=self.sql.alias):
                    if policy == "request_cancel":
                        self.transitions.request_cancel(child, reason, dispatched=False, from_parent=True)
                    else:
                        self.transitions.cancel(child, reason)
            except (WorkflowTerminalError, WorkflowNotFound):
                continue  # finished meanwhile
            closed.append(str(child))
            if policy != "request_cancel":
                closed += self.close_children(str(child), f"its parent run {child} was cancelled")
        return closed
