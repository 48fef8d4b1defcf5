"""Waiting for started work: ``ctx.wait_all`` and ``ctx.wait_any`` over the handles of
queued activities and child workflows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import codec
from .activities import ActivityHandle
from .children import ChildHandle, poll_child
from .errors import ConfigurationError, nondeterminism_error
from .messages import BlockingStart
from .records import StepKind, StepStatus, TimerWrite

if TYPE_CHECKING:
    from .context import WorkflowContext

Handle = ActivityHandle[Any] | ChildHandle[Any]


def wait_all(ctx: WorkflowContext, handles: Sequence[Handle]) -> list[Any]:
    ctx._forbid_in_handler("wait for activities")
    ctx._enter()
    handles = _own_handles(ctx, handles, "wait_all")
    seqs = [handle.seq for handle in handles]
    # wait_all takes a position only when handlers run while it blocks: a marker
    # naming the handles it waited for, so that a replay re-applies those handlers
    # at this wait and at no other wait_all that reaches the same position.
    recorded = ctx._steps.get(ctx._seq)
    marked = (
        recorded is not None
        and recorded.kind == StepKind.WAIT
        and recorded.name == "wait_all"
        and (recorded.result or {}).get("seqs") == seqs
    )
    if marked:
        ctx._seq += 1
        ctx._messages.replay_handlers()

    recorded_marker: list[bool] = []

    def record_marker() -> None:
        if not marked and not recorded_marker:
            recorded_marker.append(True)
            marker = ctx._step(
                ctx._handler_position(),
                StepKind.WAIT,
                "wait_all",
                StepStatus.COMPLETED,
                result_json=codec.dumps({"seqs": seqs}),
            )
            BlockingStart(ctx, marker).record()

    # A pending cancellation request is received here (after the marker), before the
    # handles are looked at: even if they have all finished meanwhile.
    ctx._messages.deliver_cancellation(record_marker, None)
    states, pending, timers = _poll_all(ctx, handles)
    if pending:
        ctx._messages.deliver(before=record_marker)
        ctx._park({"kind": "activities", "mode": "all", "seqs": pending}, [], timers)
    done = [state for state in states if state is not None]
    for ok, value in done:
        if not ok:
            raise value
    return [value for _, value in done]


def wait_any(ctx: WorkflowContext, handles: Sequence[Handle]) -> Handle:
    ctx._forbid_in_handler("wait for activities")
    handles = _own_handles(ctx, handles, "wait_any")
    if not handles:
        raise ConfigurationError("ctx.wait_any needs at least one handle")
    seq, recorded = ctx._next(StepKind.WAIT, "wait_any")
    ctx._messages.replay_handlers()
    if recorded is not None and recorded.status == StepStatus.COMPLETED:
        index = recorded.result["index"]
        if index >= len(handles) or handles[index].seq != recorded.result["seq"]:
            ctx._hold(
                nondeterminism_error(
                    ctx._claimed,
                    position=seq,
                    finding=f"ctx.wait_any at position {seq} returned the activity at position "
                    f"{recorded.result['seq']} before, which is not handle {index} of the handles "
                    "it is given now",
                    remedy=None,
                    recorded=recorded.result,
                    requested={"seqs": [h.seq for h in handles]},
                )
            )
        return handles[index]
    start = BlockingStart(
        ctx,
        None
        if recorded is not None
        else ctx._step(seq, StepKind.WAIT, "wait_any", StepStatus.WAITING, finished=False),
    )
    ctx._messages.deliver_cancellation(start.record, seq)
    states, pending, timers = _poll_all(ctx, handles)
    for index, (handle, state) in enumerate(zip(handles, states, strict=True)):
        if state is not None:
            ctx._commit(
                ctx._step(
                    seq,
                    StepKind.WAIT,
                    "wait_any",
                    StepStatus.COMPLETED,
                    result_json=codec.dumps({"index": index, "seq": handle.seq}),
                )
            )
            return handle
    ctx._messages.deliver(before=start.record)
    ctx._park({"kind": "activities", "mode": "any", "seqs": pending}, start.unrecorded(), timers)


def poll(ctx: WorkflowContext, handle: Handle, timers: list[TimerWrite]) -> tuple[bool, Any] | None:
    """Where started work stands: ``(True, value)``, ``(False, error)`` or ``None`` while
    pending (adding to ``timers`` what must wake the run for it)."""
    if handle._outcome is not None:
        return handle._outcome
    if isinstance(handle, ChildHandle):
        return poll_child(ctx, handle)
    return ctx._activities.poll(handle, timers)


def _own_handles(ctx: WorkflowContext, handles: Sequence[Handle], what: str) -> list[Handle]:
    handles = list(handles)
    for handle in handles:
        if not isinstance(handle, ActivityHandle | ChildHandle) or handle._ctx is not ctx:
            raise ConfigurationError(
                f"ctx.{what} takes handles returned by ctx.start or ctx.start_child in this "
                f"workflow run; got {handle!r}"
            )
    return handles


def _poll_all(
    ctx: WorkflowContext, handles: list[Handle]
) -> tuple[list[tuple[bool, Any] | None], list[int], list[TimerWrite]]:
    """Each handle's state (see :func:`poll`), the positions still pending and the timers
    that must wake the run for them."""
    states: list[tuple[bool, Any] | None] = []
    pending: list[int] = []
    timers: list[TimerWrite] = []
    for handle in handles:
        state = poll(ctx, handle, timers)
        states.append(state)
        if state is None:
            pending.append(handle.seq)
    return states, pending, timers
