"""Parking a run on an inline activity attempt that cannot run now: one flow control
holds (a rate limit's moment to come, a concurrency slot to free) or one waiting for a
durable retry. :class:`AttemptParking` is :class:`~.activities.ActivityCalls`'s part of
it: it lets an attempt through flow control for the attempt's duration and gives its slot
back after, and records the waiting step and its timer when the run parks
(docs/explanation/flow-control.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

from .attempt import AttemptFlow, admit_attempt, new_slot_holder
from .errors import CancellationRequested
from .flow import Hold, HoldKind
from .records import StepWrite, TimerKind, TimerWrite
from .registry import Activity
from .run_logging import get_logger

if TYPE_CHECKING:
    from .attempt import Attempt
    from .context import WorkflowContext

logger = get_logger("django_weft.engine")


class AttemptParking:
    """Flow control and durable waits for the inline attempts of one turn."""

    def __init__(self, ctx: WorkflowContext) -> None:
        self._ctx = ctx

    @contextmanager
    def admitted(
        self,
        act: Activity[..., Any],
        seq: int,
        flow: AttemptFlow | None,
        reserved: datetime | None,
        held: Callable[[Hold], StepWrite],
    ) -> Iterator[Attempt | None]:
        """Let an inline attempt go through flow control (:func:`admit_attempt`) for the
        duration of the block: a held attempt parks the run (``held`` records its step),
        holding no slot meanwhile unless it waits for one. The block gets ``None``, or
        the failed attempt to record when the keys could not be computed; the slot is
        given back, and handed on, when it ends."""
        if flow is None or flow.refusal is not None:
            yield None if flow is None else flow.refusal
            return
        ctx = self._ctx
        engine, run_id = ctx._engine, ctx._claimed.run_id
        ttl = ctx._config.lease_ttl
        # The database's clock, read now: the turn's own (the claim's, plus the time
        # since) can be behind by a wait for the claim's lock, and lateness is measured
        # to the millisecond.
        holder = new_slot_holder()
        hold, slot = admit_attempt(
            engine.store, act, flow, run_id, seq, ttl=ttl, reserved=reserved, now=engine.store.db_now,
            holder=holder,
        )  # fmt: skip
        try:
            if hold is not None:
                if hold.kind == HoldKind.CONCURRENCY:  # queued for a slot: it keeps its place
                    self.park_held(act, seq, hold, [held(hold)], slot_key=flow.slot_key)
                if slot:
                    slot = False
                    self.release_slot(act, seq, flow.slot_key, holder)
                self.park_held(act, seq, hold, [held(hold)])
            with engine.holding_slot(run_id, seq, holder) if slot else nullcontext():
                yield None
        finally:
            if slot:
                self.release_slot(act, seq, flow.slot_key, holder)

    def release_slot(self, act: Activity[..., Any], seq: int, key: str, holder: str | None = None) -> None:
        """Give back the slot the execution ``holder`` holds, or (``None``) the attempt's
        place in the queue, and wake the attempts the free slots were handed on to. A
        failure is logged: the slot's lease frees it meanwhile."""
        assert act.concurrency is not None
        ctx = self._ctx
        engine = ctx._engine
        try:
            woken = engine.store.release_activity_slot(
                act.name, key, act.concurrency.limit, ctx._claimed.run_id, seq, ctx._config.lease_ttl, holder
            )
        except Exception:
            logger.warning("run %s: could not give back the concurrency slot of activity %s; its lease "
                           "frees it", ctx._claimed.run_id, act.name, exc_info=True)  # fmt: skip
            return
        for run_id in woken:
            engine.dispatch_turn(run_id)

    def park_held(
        self,
        act: Activity[..., Any],
        seq: int,
        hold: Hold,
        steps: list[StepWrite],
        *,
        slot_key: str | None = None,
    ) -> NoReturn:
        """Park the run on an inline attempt flow control holds, as a durable retry does:
        ``steps`` (its ``delayed`` step) recorded, a timer at ``hold.until``, no message
        handled meanwhile. ``slot_key``: it is queued for a slot, which it gives up if a
        cancellation request is received here instead."""
        ctx = self._ctx

        def record_hold() -> None:
            for step in steps:
                ctx._commit(step)

        try:
            ctx._messages.deliver_cancellation(record_hold, seq)
        except CancellationRequested:
            if slot_key is not None:
                self.release_slot(act, seq, slot_key)
            raise
        ctx._park(
            hold.waiting_on(seq),
            steps,
            [TimerWrite(seq, TimerKind.RETRY, hold.until)],
            wakes_on_messages=False,
        )

    def park_for_retry(
        self, act: Activity[..., Any], seq: int, retry_at: datetime, steps: list[StepWrite]
    ) -> NoReturn:
        ctx = self._ctx

        def record_retrying() -> None:
            for step in steps:
                ctx._commit(step)

        # Waiting for a durable retry is a blocking point: a pending cancellation request
        # is received here (after the retrying step), and its timer removed.
        ctx._messages.deliver_cancellation(record_retrying, seq)
        ctx._park(
            {"kind": "retry", "seq": seq, "activity": act.name, "fire_at": retry_at.isoformat()},
            steps,
            [TimerWrite(seq, TimerKind.RETRY, retry_at)],
            wakes_on_messages=False,
        )
