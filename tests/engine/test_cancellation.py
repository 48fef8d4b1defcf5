"""Cancellation requests workflow code can observe: received at a blocking point as
``CancellationRequested``, at a recorded position, and replayed from it."""

from __future__ import annotations

from typing import Any

import pytest

from django_weft.engine import faults
from django_weft.engine.attempt import ActivityInfo, CancelProbe, activity_info, cancellation_seen
from django_weft.engine.errors import (
    CancellationRequested,
    WorkflowCancelled,
    WorkflowTerminalError,
)
from django_weft.engine.executor import Engine, EngineConfig, TurnOutcome
from django_weft.engine.records import CancelRequest, TimerKind
from django_weft.engine.registry import Activity
from django_weft.engine.retry import RetryPolicy

from .conftest import Harness

calls: list[str] = []


def _note(key: str) -> str:
    calls.append(key)
    return key


note = Activity(fn=_note, name="cancel.note")


def _lookup(n: int) -> int:
    raise AssertionError("a queued activity runs on a worker, not in the turn")


lookup = Activity(fn=_lookup, name="cancel.lookup", queue="io")


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    calls.clear()


class Crash(BaseException):
    """A process dying at a fault point (not an exception workflow code could catch)."""


def crash(_context: dict[str, Any]) -> None:
    raise Crash


def test_a_caught_request_runs_durable_compensation_and_the_run_ends_cancelled(weft: Harness) -> None:
    @weft.workflow("cancel.saga")
    def saga(ctx: Any) -> str:
        ctx.run(note, "reserve")
        try:
            ctx.sleep("1h")
        except CancellationRequested as exc:
            ctx.run(note, f"release ({exc.reason})")
            raise
        return "done"

    run_id = weft.store.start("cancel.saga")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    assert weft.store.request_cancel(run_id, "customer asked")
    assert weft.store.runs[run_id].status == "running"  # woken at once
    assert weft.turn(run_id) == TurnOutcome.CANCELLED

    run = weft.store.runs[run_id]
    assert run.status == "cancelled" and run.failure_category == "cancellation"
    assert run.error["reason"] == "customer asked"
    assert run.error["message"] == "cancelled on request: customer asked"
    assert weft.history(run_id) == [
        (0, "activity", "cancel.note", "completed"),
        (1, "sleep", "sleep", "waiting"),
        (2, "cancel_request", "cancel", "completed"),
        (3, "activity", "cancel.note", "completed"),
    ]
    assert weft.step(run_id, 2).result["reason"] == "customer asked"
    assert calls == ["reserve", "release (customer asked)"]
    assert run.cancel_request is not None and run.cancel_request.seq == 2
    assert run.timers == {}


def test_an_ignored_request_wakes_a_long_sleep_at_once_and_cancels_the_run(weft: Harness) -> None:
    @weft.workflow("cancel.sleeper")
    def sleeper(ctx: Any) -> str:
        ctx.sleep("1h")
        ctx.run(note, "after")
        return "done"

    run_id = weft.store.start("cancel.sleeper")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    assert (0, TimerKind.SLEEP) in weft.store.runs[run_id].timers
    weft.store.request_cancel(run_id)
    assert weft.turn(run_id) == TurnOutcome.CANCELLED
    run = weft.store.runs[run_id]
    assert run.status == "cancelled" and run.error["message"] == "cancelled on request"
    assert run.timers == {} and calls == []


def test_a_caught_request_lets_the_run_carry_on_and_replay_raises_it_at_the_same_point(weft: Harness) -> None:
    @weft.workflow("cancel.carry_on")
    def carry_on(ctx: Any) -> list[str]:
        seen = []
        try:
            ctx.sleep("1h")
        except WorkflowCancelled as exc:
            seen.append(ctx.run(note, f"caught at {exc.seq}"))
        ctx.sleep(10)  # parks again: the next turn replays the request from the history
        seen.append(ctx.run(note, "finished"))
        return seen

    run_id = weft.store.start("cancel.carry_on")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.request_cancel(run_id, "maybe")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    # The first sleep's timer went with the request; the second sleep has its own.
    assert set(weft.store.runs[run_id].timers) == {(3, TimerKind.SLEEP)}
    weft.store.advance(11)
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == ["caught at 1", "finished"]
    assert calls == ["caught at 1", "finished"]  # the compensation ran once
    assert weft.history(run_id)[1] == (1, "cancel_request", "cancel", "completed")


def test_a_request_pending_at_the_claim_is_received_at_the_first_blocking_point(weft: Harness) -> None:
    @weft.workflow("cancel.later")
    def later(ctx: Any) -> str:
        ctx.run(note, "inline 1")
        ctx.run(note, "inline 2")  # not blocking points: they run
        try:
            ctx.wait_signal("go")
        except CancellationRequested:
            return "cancelled at the wait"
        return "went"

    run_id = weft.store.start("cancel.later")
    weft.store.request_cancel(run_id, "early")
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == "cancelled at the wait"
    assert [entry[1] for entry in weft.history(run_id)] == [
        "activity",
        "activity",
        "signal",
        "cancel_request",
    ]


def test_a_request_that_arrives_during_the_turn_keeps_the_run_from_parking(weft: Harness) -> None:
    run_ids: list[str] = []

    def _request_meanwhile() -> None:
        weft.store.request_cancel(run_ids[0], "meanwhile")

    meanwhile = Activity(fn=_request_meanwhile, name="cancel.meanwhile")

    @weft.workflow("cancel.meanwhile")
    def workflow(ctx: Any) -> str:
        ctx.run(meanwhile)
        ctx.sleep("1h")
        return "slept"

    run_ids.append(weft.store.start("cancel.meanwhile"))
    run_id = run_ids[0]
    # The claim did not see the request; the park does, and leaves the run runnable.
    assert weft.turn(run_id) == TurnOutcome.PARKED
    assert weft.store.runs[run_id].status == "running"
    assert weft.dispatcher.turns[-1] == (run_id, None)
    assert weft.turn(run_id) == TurnOutcome.CANCELLED
    assert weft.history(run_id)[-1] == (2, "cancel_request", "cancel", "completed")


def test_every_kind_of_wait_receives_the_request(weft: Harness) -> None:
    @weft.workflow("cancel.child")
    def child(ctx: Any) -> str:
        ctx.sleep("1d")
        return "grown"

    waits = {
        "signal": lambda ctx: ctx.wait_signal("go", timeout="1d"),
        "condition": lambda ctx: ctx.wait_condition(lambda: False, timeout="1d"),
        "activity": lambda ctx: ctx.run(lookup, 1),
        "all": lambda ctx: ctx.wait_all([ctx.start(lookup, 1), ctx.start(lookup, 2)]),
        "any": lambda ctx: ctx.wait_any([ctx.start(lookup, 1)]),
        "child": lambda ctx: ctx.run_child("cancel.child", parent_close_policy="abandon"),
    }
    for kind, wait in waits.items():

        @weft.workflow(f"cancel.wait.{kind}")
        def waiting(ctx: Any, wait: Any = wait) -> str:
            try:
                wait(ctx)
            except CancellationRequested as exc:
                return f"received at {exc.seq}"
            return "not cancelled"

        run_id = weft.store.start(f"cancel.wait.{kind}")
        assert weft.turn(run_id) == TurnOutcome.PARKED, kind
        weft.store.request_cancel(run_id)
        assert weft.turn(run_id) == TurnOutcome.COMPLETED, kind
        result = weft.store.runs[run_id].result
        last = weft.history(run_id)[-1]
        assert last[1:] == ("cancel_request", "cancel", "completed"), (kind, weft.history(run_id))
        assert result == f"received at {last[0]}", kind
        # Signal and condition timeouts are removed with the request; activity leases stay.
        assert not [key for key in weft.store.runs[run_id].timers if key[1] != TimerKind.ACTIVITY], kind


def test_a_durable_retry_receives_the_request_and_replays_it(weft: Harness) -> None:
    attempts: list[int] = []

    def _flaky() -> None:
        attempts.append(1)
        raise RuntimeError("down")

    flaky = Activity(fn=_flaky, name="cancel.flaky", retry=RetryPolicy(max_attempts=5, initial_interval=600))

    @weft.workflow("cancel.retry")
    def retrying(ctx: Any) -> str:
        try:
            ctx.run(flaky)
        except CancellationRequested:
            ctx.sleep(5)
            return "gave up"
        return "worked"

    run_id = weft.store.start("cancel.retry")
    assert weft.turn(run_id) == TurnOutcome.PARKED  # waiting 600 s for the second attempt
    assert weft.store.runs[run_id].waiting_on["kind"] == "retry"
    weft.store.request_cancel(run_id)
    assert weft.turn(run_id) == TurnOutcome.PARKED  # caught, now sleeping
    assert (0, TimerKind.RETRY) not in weft.store.runs[run_id].timers
    weft.store.advance(6)
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == "gave up"
    assert attempts == [1]
    assert weft.history(run_id)[:2] == [(0, "activity", "cancel.flaky", "retrying"),
                                        (1, "cancel_request", "cancel", "completed")]  # fmt: skip


def test_a_second_request_while_one_is_pending_stores_nothing_and_a_later_one_is_received_again(
    weft: Harness,
) -> None:
    @weft.workflow("cancel.stubborn")
    def stubborn(ctx: Any) -> int:
        received = 0
        while received < 2:
            try:
                ctx.sleep("1h")
            except CancellationRequested:
                received += 1
        return received

    run_id = weft.store.start("cancel.stubborn")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    assert weft.store.request_cancel(run_id, "first")
    assert not weft.store.request_cancel(run_id, "again")  # pending: nothing new
    assert weft.store.runs[run_id].cancel_request.reason == "first"
    assert weft.turn(run_id) == TurnOutcome.PARKED
    assert weft.store.request_cancel(run_id, "second")  # the first was received
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == 2
    kinds = [entry[1] for entry in weft.history(run_id)]
    assert kinds == ["sleep", "cancel_request", "sleep", "cancel_request"]
    with pytest.raises(WorkflowTerminalError):
        weft.store.request_cancel(run_id)


def test_a_crash_before_the_request_is_recorded_delivers_it_once_to_the_next_owner(weft: Harness) -> None:
    @weft.workflow("cancel.crashy")
    def crashy(ctx: Any) -> str:
        try:
            ctx.sleep("1h")
        except CancellationRequested:
            ctx.run(note, "compensate")
            raise
        return "slept"

    run_id = weft.store.start("cancel.crashy")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.request_cancel(run_id)
    faults.arm("before_cancel_delivery", crash)
    with pytest.raises(Crash):
        weft.turn(run_id)
    faults.disarm()
    assert [entry[1] for entry in weft.history(run_id)] == ["sleep"]
    assert weft.store.runs[run_id].cancel_request.pending

    # The next owner takes the run over once the dead one's lease has expired.
    weft.store.advance(60)
    other = Engine(weft.store, weft.dispatcher, lambda: EngineConfig(), engine_id="engine-2",
                   workflows=weft.workflows)  # fmt: skip
    assert other.run_turn(run_id) == TurnOutcome.CANCELLED
    assert calls == ["compensate"]
    assert [entry[1] for entry in weft.history(run_id)] == ["sleep", "cancel_request", "activity"]


def test_a_crash_after_the_request_was_recorded_replays_it_without_a_second_delivery(weft: Harness) -> None:
    @weft.workflow("cancel.crash_after")
    def crash_after(ctx: Any) -> str:
        try:
            ctx.sleep("1h")
        except CancellationRequested:
            ctx.run(note, "compensate")
            ctx.run(note, "tidy")
            raise
        return "slept"

    run_id = weft.store.start("cancel.crash_after")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.request_cancel(run_id)
    faults.arm("after_step_commit", crash, on_hit=2)  # the request's entry, then the compensation
    with pytest.raises(Crash):
        weft.turn(run_id)
    faults.disarm()
    assert not weft.store.runs[run_id].cancel_request.pending
    weft.store.advance(60)
    other = Engine(weft.store, weft.dispatcher, lambda: EngineConfig(), engine_id="engine-2",
                   workflows=weft.workflows)  # fmt: skip
    assert other.run_turn(run_id) == TurnOutcome.CANCELLED
    assert calls == ["compensate", "tidy"]
    assert [entry[1] for entry in weft.history(run_id)] == ["sleep", "cancel_request", "activity", "activity"]


def test_request_cancel_children_receive_a_request_and_terminate_children_are_cancelled(
    weft: Harness,
) -> None:
    @weft.workflow("cancel.kid")
    def kid(ctx: Any) -> str:
        try:
            ctx.sleep("1d")
        except CancellationRequested as exc:
            ctx.run(note, f"kid cleaned up: {exc.reason}")
            raise
        return "grown"

    @weft.workflow("cancel.parent")
    def parent(ctx: Any) -> str:
        ctx.start_child("cancel.kid", id="polite", parent_close_policy="request_cancel")
        ctx.start_child("cancel.kid", id="blunt", parent_close_policy="terminate")
        return "done"

    parent_id = weft.store.start("cancel.parent")
    assert weft.turn(parent_id) == TurnOutcome.COMPLETED
    kids = {run.workflow_id: run for run in weft.store.runs.values() if run.parent_run_id == parent_id}
    assert kids["blunt"].status == "cancelled"
    polite = kids["polite"]
    assert polite.status == "running" and polite.cancel_request.from_parent
    assert weft.turn(polite.run_id) == TurnOutcome.CANCELLED
    assert calls == [f"kid cleaned up: its parent run {parent_id} completed"]


def test_a_workflow_raising_workflow_cancelled_itself_ends_cancelled(weft: Harness) -> None:
    @weft.workflow("cancel.self")
    def itself(ctx: Any) -> None:
        raise WorkflowCancelled("nothing left to do")

    run_id = weft.store.start("cancel.self")
    assert weft.turn(run_id) == TurnOutcome.CANCELLED
    run = weft.store.runs[run_id]
    assert (
        run.status == "cancelled" and run.error["message"] == "cancelled by the workflow: nothing left to do"
    )


def test_an_inline_activity_sees_a_pending_request_at_its_heartbeat(weft: Harness) -> None:
    seen: list[Any] = []

    def _long() -> str:
        info = activity_info()
        seen.append(info.cancel_requested)
        try:
            info.heartbeat()
        except CancellationRequested as exc:
            seen.append(exc.reason)
            raise
        return "finished"

    long = Activity(fn=_long, name="cancel.long")

    @weft.workflow("cancel.inline_heartbeat")
    def inline(ctx: Any) -> str:
        return str(ctx.run(long))

    run_id = weft.store.start("cancel.inline_heartbeat")
    weft.store.request_cancel(run_id, "stop")
    # The activity stops, its failure propagates: the run ends cancelled, not failed.
    assert weft.turn(run_id) == TurnOutcome.CANCELLED
    assert seen == [True, "cancellation requested: stop"]
    step = weft.step(run_id, 0)
    assert step.status == "failed" and step.attempt == 1  # not retried
    assert weft.store.runs[run_id].error["message"].startswith("cancelled: activity cancel.long stopped")


def test_a_compensation_activity_after_the_request_is_not_told_to_stop(weft: Harness) -> None:
    seen: list[bool] = []

    def _compensate() -> None:
        info = activity_info()
        info.heartbeat()
        seen.append(info.cancel_requested)

    compensate = Activity(fn=_compensate, name="cancel.compensate")

    @weft.workflow("cancel.compensating")
    def compensating(ctx: Any) -> str:
        try:
            ctx.sleep("1h")
        except CancellationRequested:
            ctx.run(compensate)
            raise
        return "slept"

    run_id = weft.store.start("cancel.compensating")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.request_cancel(run_id)
    assert weft.turn(run_id) == TurnOutcome.CANCELLED
    assert seen == [False]


def test_cancellation_seen_rules() -> None:
    pending = CancelRequest("2030-01-01T00:00:00+00:00", "why")
    received_at_5 = CancelRequest("2030-01-01T00:00:00+00:00", None, seq=5)
    assert cancellation_seen("waiting", None, 3) is None
    assert cancellation_seen("waiting", pending, 3) == "cancellation requested: why"
    assert cancellation_seen("running", received_at_5, 3) == "cancellation requested"  # after it started
    assert cancellation_seen("running", received_at_5, 7) is None  # before it started
    assert cancellation_seen("cancelled", None, 3) == "the run has finished (cancelled)"
    assert cancellation_seen(None, None, 3) == "the run no longer exists"
    assert CancelRequest.of(received_at_5.as_json()) == received_at_5
    assert CancelRequest.of(None) is None and CancelRequest.of({"reason": "x"}) is None


def test_heartbeat_without_a_probe_never_raises_and_a_seen_request_stays_seen() -> None:
    info = ActivityInfo("r", "w", "wf", "act", 1, 1)
    info.heartbeat()
    assert not info.cancel_requested
    answers = iter(["cancellation requested", None])
    probe = CancelProbe(lambda: next(answers))
    info = ActivityInfo("r", "w", "wf", "act", 1, 1, probe)
    with pytest.raises(CancellationRequested):
        info.heartbeat()
    with pytest.raises(CancellationRequested):
        info.heartbeat()  # set once, stays set: no second read
    assert info.cancel_requested


def test_the_current_blocking_point_receives_the_request_even_if_it_could_return_at_once(
    weft: Harness,
) -> None:
    @weft.workflow("cancel.two_sleeps")
    def two_sleeps(ctx: Any) -> str:
        ctx.sleep(1)
        ctx.sleep(1)
        return "slept"

    run_id = weft.store.start("cancel.two_sleeps")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.advance(2)
    # The sleep's time has passed, and a request was stored: the sleep receives it.
    weft.store.request_cancel(run_id)
    assert weft.turn(run_id) == TurnOutcome.CANCELLED
    assert [entry[1:] for entry in weft.history(run_id)] == [
        ("sleep", "sleep", "waiting"),
        ("cancel_request", "cancel", "completed"),
    ]


def test_a_finished_activity_does_not_hide_the_request_from_the_wait_for_it(weft: Harness) -> None:
    @weft.workflow("cancel.finished_meanwhile")
    def finished_meanwhile(ctx: Any) -> Any:
        handle = ctx.start(lookup, 1)
        try:
            return handle.result()
        except CancellationRequested:
            return "cancelled at the wait"

    run_id = weft.store.start("cancel.finished_meanwhile")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.finish_activity(run_id, 0, result=10)
    weft.store.request_cancel(run_id)
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == "cancelled at the wait"
    assert [entry[1] for entry in weft.history(run_id)] == ["activity", "wait", "cancel_request"]


def test_waits_passed_before_the_request_replay_without_receiving_it(weft: Harness) -> None:
    @weft.workflow("cancel.passed")
    def passed(ctx: Any) -> list[Any]:
        first = ctx.start(lookup, 1).result()  # returned in an earlier turn
        try:
            ctx.sleep("1h")
        except CancellationRequested as exc:
            return [first, exc.seq]
        return [first]

    run_id = weft.store.start("cancel.passed")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.finish_activity(run_id, 0, result=10)
    assert weft.turn(run_id) == TurnOutcome.PARKED  # past the wait, now sleeping
    weft.store.request_cancel(run_id)
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == [10, 2]


def test_an_activity_failed_by_an_unrelated_error_still_fails_the_run(weft: Harness) -> None:
    def _broken() -> None:
        raise KeyError("nope")

    broken = Activity(fn=_broken, name="cancel.broken")

    @weft.workflow("cancel.broken")
    def workflow(ctx: Any) -> None:
        ctx.run(broken)

    run_id = weft.store.start("cancel.broken")
    assert weft.turn(run_id) == TurnOutcome.FAILED
    assert weft.store.runs[run_id].failure_category == "activity"
