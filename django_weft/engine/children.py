"""Child workflows: starting one from a workflow, and recording how it ended."""

from __future__ import annotations

import hashlib
import uuid
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from . import codec, observe
from .errors import ChildWorkflowFailed, ConfigurationError
from .records import PARENT_CLOSE_POLICIES, ChildStart, StepKind, StepStatus

if TYPE_CHECKING:
    from .context import WorkflowContext

T = TypeVar("T")


class ChildHandle(Generic[T]):
    """A child workflow started with :meth:`WorkflowContext.start_child`; wait for it with
    :meth:`result`, :meth:`WorkflowContext.wait_all` or :meth:`WorkflowContext.wait_any`."""

    def __init__(
        self, ctx: WorkflowContext, workflow_name: str, seq: int, run_id: str, workflow_id: str
    ) -> None:
        self._ctx = ctx
        self.workflow_name = workflow_name
        self.seq = seq
        self.run_id = run_id
        self.workflow_id = workflow_id
        self._outcome: tuple[bool, Any] | None = None

    def result(self) -> T:
        """The child's result; waits durably (the parent parks) until the child has
        finished. Raises :class:`ChildWorkflowFailed` if it did not complete."""
        values: list[T] = self._ctx.wait_all([self])
        return values[0]

    def __repr__(self) -> str:
        return f"<ChildHandle {self.workflow_name} {self.workflow_id} at position {self.seq}>"


def child_workflow_id(parent_workflow_id: str, seq: int) -> str:
    """``"<parent workflow id>:<position>"``, shortened (with a digest of the whole parent
    id, so it stays unique) when that would pass the 255-character limit."""
    candidate = f"{parent_workflow_id}:{seq}"
    if len(candidate) <= 255:
        return candidate
    digest = hashlib.sha256(parent_workflow_id.encode()).hexdigest()[:16]
    return f"{parent_workflow_id[:200]}~{digest}:{seq}"


def start_child(
    ctx: WorkflowContext,
    workflow: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    id: str | None,
    parent_close_policy: str,
) -> ChildHandle[Any]:
    """Record the child step and create the child run (one fenced write), then ring the
    child's doorbell; on replay, the handle of the child recorded at this position."""
    ctx._forbid_in_handler("start a child workflow")
    name = workflow if isinstance(workflow, str) else getattr(workflow, "name", None)
    if not isinstance(name, str):
        raise ConfigurationError(f"ctx.start_child takes a workflow name or @workflow; got {workflow!r}")
    if parent_close_policy not in PARENT_CLOSE_POLICIES:
        raise ConfigurationError(
            f"parent_close_policy must be one of {', '.join(PARENT_CLOSE_POLICIES)}; "
            f"got {parent_close_policy!r}"
        )
    if id is not None and (
        not isinstance(id, str) or not id.strip() or len(id) > 255 or any(ord(ch) < 32 for ch in id)
    ):
        raise ConfigurationError(
            f"a child workflow id must be a non-empty string of at most 255 characters without "
            f"control characters; got {id!r}"
        )
    seq, recorded = ctx._next(StepKind.CHILD, name)
    if recorded is not None:
        info = recorded.result or {}
        return ChildHandle(ctx, name, seq, str(info.get("run_id")), str(info.get("workflow_id")))
    ctx._frontier()
    definition = ctx._engine.workflows.get_workflow(name)
    child = ChildStart(
        run_id=str(uuid.uuid4()),
        workflow_id=id if id is not None else child_workflow_id(ctx._claimed.workflow_id, seq),
        workflow_name=definition.name,
        workflow_version=definition.version,
        args_json=codec.dumps(list(args), what=f"arguments of child workflow {name}"),
        kwargs_json=codec.dumps(kwargs, what=f"keyword arguments of child workflow {name}"),
        parent_close_policy=parent_close_policy,
        priority=ctx._claimed.priority,
        trace_context=observe.start_carrier(),
    )
    info = {"run_id": child.run_id, "workflow_id": child.workflow_id}
    step = ctx._step(
        seq, StepKind.CHILD, name, StepStatus.WAITING, result_json=codec.dumps(info), finished=False
    )
    ctx._fence.write(ctx._engine.store.start_child, step, child)
    ctx._remember(step, info, None)
    observe.run_started(run_id=child.run_id, workflow_id=child.workflow_id, workflow=child.workflow_name,
                        priority=child.priority, carrier=child.trace_context)  # fmt: skip
    ctx._engine.dispatch_turn(child.run_id, priority=ctx._claimed.priority)  # it takes its parent's
    return ChildHandle(ctx, name, seq, child.run_id, child.workflow_id)


def poll_child(ctx: WorkflowContext, handle: ChildHandle[Any]) -> tuple[bool, Any] | None:
    """``(True, result)`` or ``(False, ChildWorkflowFailed)`` once the child has finished
    (recording its outcome in this run's history the first time), ``None`` while it runs."""
    recorded = ctx._steps[handle.seq]
    if recorded.status == StepStatus.WAITING:
        outcome = ctx._engine.store.child_outcome(ctx._claimed.run_id, handle.seq)
        if outcome is None:
            return None
        # The child has finished: record its outcome in this run's history.
        done = outcome.status == "completed"
        info = {**(recorded.result or {}), "run_id": outcome.run_id}
        if done:
            info["result"] = outcome.result
        error = None if done else {**(outcome.error or {}), "status": outcome.status}
        step = ctx._step(
            handle.seq,
            StepKind.CHILD,
            handle.workflow_name,
            StepStatus.COMPLETED if done else StepStatus.FAILED,
            result_json=codec.dumps(info),
            error=error,
            started_at=recorded.started_at,
        )
        ctx._commit(step)
        ctx._remember(step, info, error)
        recorded = ctx._steps[handle.seq]
    if recorded.status == StepStatus.COMPLETED:
        handle._outcome = (True, (recorded.result or {}).get("result"))
        return handle._outcome
    error = recorded.error or {}
    status = str(error.get("status", "failed"))
    child_run_id = (recorded.result or {}).get("run_id")
    handle._outcome = (
        False,
        ChildWorkflowFailed(
            f"child workflow {handle.workflow_name} {handle.workflow_id} (run {child_run_id}) "
            f"{status}: {error.get('type')}: {error.get('message')}",
            child_run_id=str(child_run_id),
            child_workflow_id=handle.workflow_id,
            seq=handle.seq,
            status=status,
            error_type=error.get("type"),
            error_message=error.get("message"),
        ),
    )
    return handle._outcome
