"""``replay_history``: checking a stored history against changed code, read-only, on
histories recorded by the real engine on the in-memory store."""

from __future__ import annotations

from typing import Any

import pytest

from django_weft.engine.executor import TurnOutcome
from django_weft.engine.records import ClaimedRun, StepKind
from django_weft.engine.registry import Activity, Workflow
from django_weft.engine.replay import (
    HistoryOnlyStore,
    RefusingDispatcher,
    ReplayEnd,
    ReplayResult,
    ReplayVerdict,
    ReplayWriteRefused,
    replay_history,
)

from .conftest import Harness

calls: list[str] = []


def reserve() -> str:
    calls.append("reserve")
    return "reserved"


def charge() -> str:
    calls.append("charge")
    return "charged"


def ship() -> str:
    calls.append("ship")
    return "shipped"


@pytest.fixture(autouse=True)
def _no_calls() -> None:
    calls.clear()


def stored(weft: Harness, run_id: str) -> ClaimedRun:
    """The run as a replay reads it: its arguments and recorded steps."""
    run = weft.store.runs[run_id]
    return ClaimedRun(
        run_id=run_id,
        workflow_id=run.workflow_id,
        workflow_name=run.workflow_name,
        args=run.args,
        kwargs=run.kwargs,
        epoch=0,
        attempt=run.attempt,
        created_at=run.created_at,
        db_now=weft.store.now,
        steps={step.seq: step for step in weft.store.history(run_id)},
    )


def replay(weft: Harness, run_id: str) -> ReplayResult:
    """Replay, checking that nothing in the store changed and no activity ran."""
    history, doorbells = weft.history(run_id), list(weft.dispatcher.turns)
    calls.clear()
    result = replay_history(stored(weft, run_id), workflows=weft.workflows)
    assert weft.history(run_id) == history and weft.dispatcher.turns == doorbells
    assert calls == [], "a replay ran an activity"
    return result


def recorded_order(weft: Harness, *, wait: bool = True) -> str:
    """A run of v1 of ``order`` (reserve, charge, then a sleep), parked at the sleep or,
    with ``wait=False``, completed."""

    @weft.workflow("order")
    def v1(ctx: Any, wait: bool) -> str:
        ctx.run(reserve)
        ctx.run(charge)
        if wait:
            ctx.sleep(60)
        return "done"

    run_id = weft.store.start("order", wait)
    expected = TurnOutcome.PARKED if wait else TurnOutcome.COMPLETED
    assert weft.turn(run_id) == expected
    return run_id


def test_unchanged_code_replays_to_the_end_of_the_history(weft: Harness) -> None:
    waiting, done = recorded_order(weft), recorded_order(weft, wait=False)
    assert replay(weft, waiting) == ReplayResult(ReplayVerdict.OK, ReplayEnd.END_OF_HISTORY, 3, 3)
    assert replay(weft, done) == ReplayResult(ReplayVerdict.OK, ReplayEnd.RETURNED, 2, 2)


def test_reordered_operations_diverge_at_the_first_changed_position(weft: Harness) -> None:
    run_id = recorded_order(weft)

    @weft.workflow("order")
    def v2(ctx: Any, wait: bool) -> str:
        ctx.run(reserve)
        ctx.sleep(60)
        ctx.run(charge)
        return "done"

    result = replay(weft, run_id)
    assert result.verdict == ReplayVerdict.DIVERGED and result.end == ReplayEnd.DIVERGED
    assert result.replayed == 1
    assert result.divergence is not None
    assert result.divergence.position == 1
    assert result.divergence.recorded == {"kind": "activity", "name": f"{__name__}.charge"}
    assert result.divergence.requested == {"kind": "sleep", "name": "sleep"}
    assert "is not deterministic: at position 1" in result.divergence.message


def test_new_operations_past_the_history_are_not_executed_and_are_ok(weft: Harness) -> None:
    run_id = recorded_order(weft, wait=False)
    side_effects: list[int] = []

    @weft.workflow("order")
    def v2(ctx: Any, wait: bool) -> str:
        ctx.run(reserve)
        ctx.run(charge)
        ctx.side_effect(lambda: side_effects.append(1))
        ctx.run(ship)
        return "done"

    assert replay(weft, run_id) == ReplayResult(ReplayVerdict.OK, ReplayEnd.END_OF_HISTORY, 2, 2)
    assert side_effects == []


def test_a_function_that_ends_before_its_history_diverges(weft: Harness) -> None:
    run_id = recorded_order(weft, wait=False)

    @weft.workflow("order")
    def returns_early(ctx: Any, wait: bool) -> str:
        ctx.run(reserve)
        return "done"

    result = replay(weft, run_id)
    assert result.divergence is not None
    assert (result.divergence.position, result.divergence.requested) == (1, {"kind": "finish", "name": ""})

    @weft.workflow("order")
    def raises_early(ctx: Any, wait: bool) -> str:
        ctx.run(reserve)
        raise KeyError("customer")

    result = replay(weft, run_id)
    assert result.divergence is not None
    assert result.divergence.position == 1
    assert result.divergence.recorded == {"kind": "activity", "name": f"{__name__}.charge"}
    assert result.divergence.requested == {"kind": "raise", "name": "KeyError"}
    assert "raised KeyError: 'customer' at position 1" in result.divergence.message


def test_a_run_that_failed_replays_to_its_exception(weft: Harness) -> None:
    @weft.workflow("fails")
    def fails(ctx: Any) -> None:
        ctx.run(reserve)
        raise ValueError("out of stock")

    run_id = weft.store.start("fails")
    assert weft.turn(run_id) == TurnOutcome.FAILED
    result = replay(weft, run_id)
    assert (result.verdict, result.end) == (ReplayVerdict.OK, ReplayEnd.RAISED)
    assert result.detail == "ValueError: out of stock"


def test_continue_as_new_after_the_history_is_ok_and_before_it_diverges(weft: Harness) -> None:
    @weft.workflow("loop")
    def loop(ctx: Any, n: int) -> None:
        ctx.run(reserve)
        if n < 1:
            ctx.continue_as_new(n + 1)

    run_id = weft.store.start("loop", 0)
    assert weft.turn(run_id) == TurnOutcome.CONTINUED
    assert replay(weft, run_id).end == ReplayEnd.CONTINUED

    @weft.workflow("loop")
    def loop_sooner(ctx: Any, n: int) -> None:
        if n < 1:
            ctx.continue_as_new(n + 1)

    result = replay(weft, run_id)
    assert result.divergence is not None and result.divergence.position == 0


def test_patched_code_replays_old_runs_and_a_removed_marker_diverges(weft: Harness) -> None:
    old = recorded_order(weft)

    @weft.workflow("order")
    def patched(ctx: Any, wait: bool) -> str:
        if ctx.patched("charge-first"):
            ctx.run(charge)
            ctx.run(reserve)
        else:
            ctx.run(reserve)
            ctx.run(charge)
        ctx.sleep(60)
        return "done"

    assert replay(weft, old).verdict == ReplayVerdict.OK
    new = weft.store.start("order", True)
    assert weft.turn(new) == TurnOutcome.PARKED
    assert weft.history(new)[0][1] == StepKind.PATCH
    assert replay(weft, new) == ReplayResult(ReplayVerdict.OK, ReplayEnd.END_OF_HISTORY, 4, 4)

    @weft.workflow("order")
    def marker_removed(ctx: Any, wait: bool) -> str:
        ctx.run(charge)
        ctx.run(reserve)
        ctx.sleep(60)
        return "done"

    result = replay(weft, new)
    assert result.divergence is not None
    assert result.divergence.recorded == {"kind": "patch", "name": "charge-first"}


def test_recorded_handler_applications_replay_and_a_removed_handler_diverges(weft: Harness) -> None:
    seen: list[Any] = []

    @weft.workflow("inbox")
    def inbox(ctx: Any) -> None:
        items: list[Any] = []
        ctx.on_signal("item", items.append)
        ctx.on_update("count", lambda _: ctx.run(charge) and len(items))
        ctx.sleep(60)
        seen.append(list(items))

    run_id = weft.store.start("inbox")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.signal(run_id, "item", "a")
    update_id = weft.store.update(run_id, "count")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    assert weft.store.update_outcome(update_id)[:2] == ("completed", 1)
    kinds = [(kind, name) for _, kind, name, _ in weft.history(run_id)]
    assert kinds == [
        ("sleep", "sleep"), ("handler", "signal:item"), ("handler", "update:count"),
        ("activity", f"{__name__}.charge"),
    ]  # fmt: skip
    weft.store.advance(61)
    assert replay(weft, run_id) == ReplayResult(ReplayVerdict.OK, ReplayEnd.END_OF_HISTORY, 4, 4)

    @weft.workflow("inbox")
    def without_signal_handler(ctx: Any) -> None:
        ctx.on_update("count", lambda _: ctx.run(charge))
        ctx.sleep(60)

    result = replay(weft, run_id)
    assert result.divergence is not None
    assert result.divergence.position == 1
    assert result.divergence.recorded == {"kind": "handler", "name": "signal:item"}
    assert "no such handler registered there" in result.divergence.message


def test_a_queued_activity_in_flight_ends_the_replay_without_dispatching(weft: Harness) -> None:
    queued = Activity(fn=ship, name="queued.ship", queue="shipping")

    @weft.workflow("queued")
    def sends(ctx: Any) -> str:
        ctx.run(reserve)
        return str(ctx.run(queued))

    run_id = weft.store.start("queued")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    sent = list(weft.dispatcher.activities)
    assert replay(weft, run_id) == ReplayResult(ReplayVerdict.OK, ReplayEnd.END_OF_HISTORY, 2, 2)
    assert weft.dispatcher.activities == sent


def test_a_workflow_that_is_not_registered_is_reported_not_replayed(weft: Harness) -> None:
    run_id = recorded_order(weft)
    del weft.workflows.workflows["order"]
    result = replay(weft, run_id)
    assert (result.verdict, result.end, result.history_length) == (
        ReplayVerdict.MISSING_WORKFLOW, ReplayEnd.NOT_RUN, 3,
    )  # fmt: skip
    assert result.detail == "no workflow named 'order' is registered in this code"


def test_the_replay_store_and_dispatcher_refuse_every_write(weft: Harness) -> None:
    store, dispatcher = HistoryOnlyStore(weft.store.now), RefusingDispatcher()
    assert store.pending_messages("r") == [] and store.child_outcome("r", 0) is None
    with pytest.raises(ReplayWriteRefused, match="may not write"):
        store.commit_step("r", "owner", 1, None)
    with pytest.raises(ReplayWriteRefused, match="may not dispatch"):
        dispatcher.dispatch_turn("r")
    assert store.refused == ["record a step"] and dispatcher.refused == ["dispatch a turn of run r"]


def test_a_replay_that_reaches_a_write_fails_loudly(weft: Harness) -> None:
    """Workflow code that calls the engine's internals behind the context's back (a
    write the read-only context cannot stop, a doorbell the engine would swallow) makes
    the replay fail, not report "ok"."""
    run_id = recorded_order(weft)
    weft.workflows.workflows["order"] = Workflow(
        fn=lambda ctx, wait: ctx._engine.dispatch_turn("elsewhere"), name="order"
    )
    with pytest.raises(ReplayWriteRefused, match="tried to dispatch a turn of run elsewhere"):
        replay_history(stored(weft, run_id), workflows=weft.workflows)
