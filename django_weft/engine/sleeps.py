"""Durable sleeps: ``ctx.sleep`` and ``ctx.sleep_until`` record the moment they wait for
and park the run on a timer the sweep fires; a sleep whose moment has come by the time
it is reached (or replayed) ends at once, its end written with the turn's next write."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from . import codec
from .messages import BlockingStart
from .records import StepKind, StepStatus, TimerKind, TimerWrite

if TYPE_CHECKING:
    from .context import WorkflowContext


def durable_sleep(ctx: WorkflowContext, fire_at_from: Callable[[datetime], datetime]) -> None:
    """``ctx.sleep`` and ``ctx.sleep_until``: record a sleep until the moment ``fire_at_from``
    gives for the database's time now, and park the run on its timer; on replay, the recorded
    moment (and nothing when the sleep has ended)."""
    ctx._forbid_in_handler("sleep")
    seq, recorded = ctx._next(StepKind.SLEEP, "sleep")
    ctx._messages.replay_handlers()
    now = ctx._db_now()
    if recorded is not None:
        if recorded.status == StepStatus.COMPLETED:
            return
        fire_at = datetime.fromisoformat(recorded.result["fire_at"])
        started_at = recorded.started_at
    else:
        fire_at = fire_at_from(now)
        started_at = now
    result_json = codec.dumps({"fire_at": fire_at.isoformat()})
    start = BlockingStart(
        ctx,
        None
        if recorded is not None
        else ctx._step(
            seq, StepKind.SLEEP, "sleep", StepStatus.WAITING, result_json=result_json, finished=False
        ),
    )
    # A pending cancellation request is received here, even by a sleep whose time has come.
    ctx._messages.deliver_cancellation(start.record, seq)
    if fire_at <= now:
        if recorded is not None and ctx._read_only and ctx._due_sleeps_over:
            # Its time has come: it is over, whether or not a turn has recorded its end
            # yet (a query, or a reset's replay, goes on past it; nothing is written).
            return
        # Written with a later write, or by the run's completion: a crash before then
        # leaves the sleep recorded as waiting on a time that has passed, and the replay
        # that follows ends it again (a sleep has nothing to do twice).
        ctx._commit_later(
            ctx._step(
                seq,
                StepKind.SLEEP,
                "sleep",
                StepStatus.COMPLETED,
                result_json=result_json,
                started_at=started_at,
            ),
            rides=True,
        )
        return
    ctx._messages.deliver(before=start.record, at=seq)
    ctx._park(
        {"kind": "sleep", "seq": seq, "fire_at": fire_at.isoformat()},
        start.unrecorded(),
        [TimerWrite(seq, TimerKind.SLEEP, fire_at)],
    )
