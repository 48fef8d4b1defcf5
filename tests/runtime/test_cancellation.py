"""Cancellation requests (``handle.cancel(mode="request")``) on PostgreSQL and SQLite: the
workflow receives ``CancellationRequested`` at a blocking point, at a recorded position,
and may clean up with durable steps, or carry on."""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_weft import (
    InvalidInput,
    UpdateTimeout,
    WorkflowCancelled,
    WorkflowTerminalError,
    client,
    runtime,
    signals,
)
from django_weft.engine import faults
from django_weft.engine.executor import TurnOutcome
from django_weft.engine.messages import MessageHandling
from django_weft.models import Step, Timer, Update, WorkflowRun
from django_weft.runtime import ActivityOutcome, run_activity, tick
from django_weft.runtime.heartbeat import tell_cancellations
from django_weft.store import DjangoStore
from django_weft.testing import drive, make_engine
from tests.support.driver import park
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def count(key: str) -> int:
    return SideEffect.objects.filter(key=key).count()


def history(run_id: str) -> list[tuple[int, str, str]]:
    return list(Step.objects.filter(run_id=run_id).order_by("seq").values_list("seq", "kind", "status"))


def run_of(run_id: str) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=run_id)


# -- the acceptance scenarios ------------------------------------------------------------------


def test_a_caught_request_runs_a_durable_compensation_and_the_run_finishes_cancelled() -> None:
    received: list[dict[str, Any]] = []

    def on_cancelled(sender: Any, **kwargs: Any) -> None:
        received.append(kwargs)

    signals.run_cancelled.connect(on_cancelled)
    try:
        handle = client.start("tests.x.saga", args=["sg"])
        park(handle.run_id)
        assert handle.cancel("customer asked", mode="request") == "running"
        assert drive(handle.run_id) == "cancelled"
    finally:
        signals.run_cancelled.disconnect(on_cancelled)

    with pytest.raises(WorkflowCancelled) as caught:
        handle.result(timeout=1)
    assert caught.value.reason == "customer asked"
    run = run_of(handle.run_id)
    assert run.failure_category == "cancellation"
    assert run.error["message"] == "cancelled on request: customer asked"
    assert history(handle.run_id) == [
        (0, "activity", "completed"),
        (1, "sleep", "waiting"),
        (2, "cancel_request", "completed"),
        (3, "activity", "completed"),
    ]
    assert Step.objects.get(run_id=handle.run_id, seq=2).result["reason"] == "customer asked"
    assert (count("sg:reserve"), count("sg:release"), count("sg:ship")) == (1, 1, 0)
    assert run.cancel_request["seq"] == 2 and run.cancel_request["reason"] == "customer asked"
    assert not Timer.objects.filter(run_id=handle.run_id, fired_at__isnull=True).exists()
    assert [event["run_id"] for event in received] == [handle.run_id]
    assert received[0]["error"]["reason"] == "customer asked"


def test_a_run_ignoring_the_request_at_a_one_hour_sleep_wakes_at_once_and_is_cancelled() -> None:
    handle = client.start("tests.x.ignores", args=["ig"])
    park(handle.run_id)
    assert Timer.objects.filter(run_id=handle.run_id, kind="sleep").exists()
    started = time.monotonic()
    handle.cancel(mode="request")
    run = run_of(handle.run_id)
    assert run.status == "running" and run.ready_at is not None and run.waiting_on is None
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.CANCELLED
    assert time.monotonic() - started < 5
    assert handle.status() == "cancelled" and count("ig:after") == 0
    assert run_of(handle.run_id).error["message"] == "cancelled on request"
    assert not Timer.objects.filter(run_id=handle.run_id).exists()


def test_a_run_that_catches_the_request_carries_on_and_completes() -> None:
    handle = client.start("tests.x.carries_on", args=["co"])
    park(handle.run_id)
    handle.cancel("not now", mode="request")
    # The next turn receives it, records the step after it and parks on the second sleep;
    # the turn after that replays the request from the history and completes.
    assert drive(handle.run_id) == "completed"
    assert handle.result() == {"caught": "not now"}
    assert count("co:after") == 1
    assert [kind for _, kind, _ in history(handle.run_id)] == ["sleep", "cancel_request", "activity", "sleep"]
    assert run_of(handle.run_id).cancel_request["seq"] == 1


@pytest.mark.parametrize("mode", ["heartbeat", "poll"])
def test_a_queued_activity_heartbeating_learns_of_the_request(mode: str) -> None:
    """``heartbeat()`` raises ``CancellationRequested``; ``cancel_requested`` is set by the
    worker's lease heartbeat. Meanwhile the workflow receives the request where it waits
    for the activity and compensates."""
    key = f"hb-{mode}"
    handle = client.start("tests.x.watching", args=[key], kwargs={"seconds": 30, "mode": mode})
    park(handle.run_id)
    outcomes: list[ActivityOutcome] = []

    def work() -> None:
        try:
            outcomes.append(run_activity(handle.run_id, 0, 1))
        finally:
            connection.close()

    worker = threading.Thread(target=work)
    worker.start()
    deadline = time.monotonic() + 20
    while not count(f"{key}:started") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert count(f"{key}:started") == 1
    assert not DjangoStore().turns.cancellation_requested(handle.run_id, 0)

    handle.cancel("stop", mode="request")
    assert DjangoStore().turns.cancellation_requested(handle.run_id, 0) == "cancellation requested: stop"
    if mode == "poll":
        tell_cancellations()  # what the worker's heartbeat does every renew interval
    worker.join(30)
    assert not worker.is_alive()
    if mode == "heartbeat":
        assert count(f"{key}:heartbeat raised: cancellation requested: stop") == 1
        # The stopped attempt failed for good (not retried); the workflow decides on it.
        assert outcomes == [ActivityOutcome.FAILED]
        step = Step.objects.get(run_id=handle.run_id, seq=0)
        assert step.status == "attempt_failed" and step.error["retryable"] is False
    else:
        assert count(f"{key}:saw cancel_requested") == 1
        assert outcomes == [ActivityOutcome.COMPLETED]

    assert drive(handle.run_id) == "cancelled"
    assert count(f"{key}:compensate") == 1
    kinds = [kind for _, kind, _ in history(handle.run_id)]
    assert kinds == ["activity", "wait", "cancel_request", "activity"]


def test_the_workers_heartbeat_tells_a_running_activity_without_it_asking() -> None:
    from django_weft.engine.attempt import CancelProbe
    from django_weft.runtime.heartbeat import Heartbeat, running_attempt

    handle = client.start("tests.x.ignores", args=["tb"])
    park(handle.run_id)
    probe = CancelProbe()
    with running_attempt(handle.run_id, 5, 1, probe):
        Heartbeat(runtime.get_engine()).beat()
        assert probe.why is None
        handle.cancel(mode="request")
        Heartbeat(runtime.get_engine()).beat()
        assert probe.why == "cancellation requested"
    # Finished runs count too: nothing would record the attempt's result.
    other = client.start("tests.x.ignores", args=["tb2"])
    park(other.run_id)
    other.cancel()
    assert DjangoStore().turns.cancellation_requested(other.run_id, 1) == "the run has finished (cancelled)"


# -- storing a request ---------------------------------------------------------------------------


def test_a_second_request_while_one_is_pending_stores_nothing_new() -> None:
    handle = client.start("tests.x.ignores", args=["dup"])
    park(handle.run_id)
    handle.cancel("first", mode="request")
    stored = run_of(handle.run_id).cancel_request
    assert stored["reason"] == "first" and stored["seq"] is None
    assert handle.cancel("second", mode="request") == "running"
    assert run_of(handle.run_id).cancel_request == stored
    assert drive(handle.run_id) == "cancelled"
    assert [kind for _, kind, _ in history(handle.run_id)].count("cancel_request") == 1


def test_a_request_to_a_finished_run_is_refused_and_stores_nothing() -> None:
    handle = client.start("tests.echo")
    assert drive(handle.run_id) == "completed"
    with pytest.raises(WorkflowTerminalError):
        handle.cancel("too late", mode="request")
    assert run_of(handle.run_id).cancel_request is None


def test_bad_modes_and_reasons_are_refused_before_anything_is_stored() -> None:
    handle = client.start("tests.x.ignores", args=["bad"])
    with pytest.raises(InvalidInput, match="mode must be one of terminate, request"):
        handle.cancel(mode="politely")
    with pytest.raises(InvalidInput, match="NUL"):
        handle.cancel("a\x00b", mode="request")
    with pytest.raises(InvalidInput, match="NUL"):
        handle.cancel("a\x00b")
    run = run_of(handle.run_id)
    assert run.status == "running" and run.cancel_request is None


def test_a_suspended_run_keeps_the_request_and_receives_it_after_its_resume() -> None:
    handle = client.start("tests.x.saga", args=["sus"])
    park(handle.run_id)
    handle.suspend()
    assert handle.cancel(mode="request") == "suspended"
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.NOT_CLAIMED
    handle.resume()
    assert drive(handle.run_id) == "cancelled"
    assert count("sus:release") == 1


def test_a_request_before_the_first_turn_is_received_at_the_first_blocking_point() -> None:
    handle = client.start("tests.x.saga", args=["early"])
    assert handle.cancel(mode="request") == "running"
    assert drive(handle.run_id) == "cancelled"
    assert (count("early:reserve"), count("early:release")) == (1, 1)


def test_a_request_the_run_did_not_receive_before_continuing_as_new_goes_to_its_successor() -> None:
    handle = client.start("tests.x.continues", args=["can"], id="continues-can")
    handle.cancel(mode="request")
    assert drive(handle.run_id) == "continued"
    successor = client.get_handle(handle.workflow_id)
    assert successor.run_id != handle.run_id
    assert run_of(successor.run_id).cancel_request["seq"] is None
    assert drive(successor.run_id) == "cancelled"
    assert count("can:release") == 1


def test_a_request_by_workflow_id_follows_a_run_that_continued_as_new() -> None:
    handle = client.start("tests.x.continues", args=["cfw"], id="continues-cfw")
    assert drive(handle.run_id) == "continued"
    successor = client.get_handle(handle.workflow_id)
    park(successor.run_id)
    assert client.get_handle(handle.run_id).cancel(mode="request") == "running"
    assert drive(successor.run_id) == "cancelled"


def test_pending_updates_fail_and_the_finalizer_runs_when_the_request_ends_the_run() -> None:
    handle = client.start("tests.x.booking", args=["fin"])
    park(handle.run_id)
    with pytest.raises(UpdateTimeout):
        handle.update("note", "pending", wait=0)
    handle.cancel(mode="request")
    assert drive(handle.run_id) == "cancelled"
    run = run_of(handle.run_id)
    assert run.finalizer["status"] == "completed" and run.finalizer["result"] == "cleaned waiting"
    update = Update.objects.get(run_id=handle.run_id)
    assert update.status == "failed" and update.error["type"] == "django_weft.RunCancelled"


def test_a_crash_before_the_request_is_recorded_leaves_it_for_the_next_owner() -> None:
    class Crash(BaseException):
        pass

    def crash(_context: dict[str, Any]) -> None:
        raise Crash

    handle = client.start("tests.x.saga", args=["crash"])
    park(handle.run_id)
    handle.cancel(mode="request")
    faults.arm("before_cancel_delivery", crash)
    with pytest.raises(Crash):
        make_engine("dies").run_turn(handle.run_id)
    faults.disarm()
    assert [kind for _, kind, _ in history(handle.run_id)] == ["activity", "sleep"]
    assert run_of(handle.run_id).cancel_request["seq"] is None
    WorkflowRun.objects.filter(pk=handle.run_id).update(owner_id=None, lease_expires_at=None)
    assert drive(handle.run_id) == "cancelled"
    assert count("crash:release") == 1
    assert [kind for _, kind, _ in history(handle.run_id)].count("cancel_request") == 1


def test_a_request_stored_during_a_turn_keeps_the_run_from_parking() -> None:
    """The park reads the request under the run's row lock, as it reads messages."""
    handle = client.start("tests.x.ignores", args=["mid"])
    engine = make_engine()

    def request_meanwhile(_context: dict[str, Any]) -> None:
        done = threading.Thread(target=lambda: (handle.cancel(mode="request"), connection.close()))
        done.start()
        done.join(30)

    faults.arm("before_park", request_meanwhile)
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED
    faults.disarm()
    run = run_of(handle.run_id)
    assert run.status == "running" and run.owner_id is None  # released runnable, not parked
    assert engine.run_turn(handle.run_id) == TurnOutcome.CANCELLED


# -- children ----------------------------------------------------------------------------------


def test_the_request_cancel_close_policy_sends_a_request_and_the_sweep_does_not_repeat_it() -> None:
    parent = client.start("tests.x.parent", args=["pc"])
    assert drive(parent.run_id) == "completed"
    children = {run.parent_close_policy: run for run in WorkflowRun.objects.filter(parent_id=parent.run_id)}
    assert children["terminate"].status == "cancelled"
    polite = children["request_cancel"]
    assert polite.status in ("running", "waiting")
    assert polite.cancel_request["from_parent"] is True
    reason = polite.cancel_request["reason"]
    assert reason == f"its parent run {parent.run_id} completed"
    assert children["abandon"].cancel_request is None and children["abandon"].status != "cancelled"

    assert DjangoStore().sweep.close_orphaned_children(100) == []
    assert drive(str(polite.pk)) == "cancelled"
    assert count("pc-request_cancel:release") == 1
    assert count("pc-terminate:release") == 0
    tick()
    assert run_of(str(children["abandon"].pk)).status in ("running", "waiting")


def test_the_sweep_sends_the_request_a_dead_process_did_not() -> None:
    parent = client.start("tests.x.parent", args=["orph"])
    engine = make_engine()
    # The parent's close commits; the process dies before applying the close policy.
    engine.store.close_children = lambda run_id, reason: []  # type: ignore[method-assign]
    assert engine.run_turn(parent.run_id) == TurnOutcome.COMPLETED
    polite = WorkflowRun.objects.get(parent_id=parent.run_id, parent_close_policy="request_cancel")
    assert polite.cancel_request is None
    closed = DjangoStore().sweep.close_orphaned_children(100)
    assert str(polite.pk) in closed
    assert run_of(str(polite.pk)).cancel_request["from_parent"] is True
    assert DjangoStore().sweep.close_orphaned_children(100) == []


# -- the surfaces ----------------------------------------------------------------------------------


def test_weft_cancel_request_sends_a_request() -> None:
    handle = client.start("tests.x.saga", args=["cmd"])
    park(handle.run_id)
    out = io.StringIO()
    call_command("weft_cancel", handle.run_id, "--request", "--reason", "ops", stdout=out)
    assert "asked to cancel run" in out.getvalue() and "now running" in out.getvalue()
    assert run_of(handle.run_id).cancel_request["reason"] == "ops"
    assert drive(handle.run_id) == "cancelled"
    with pytest.raises(CommandError, match="finished run"):
        call_command("weft_cancel", handle.run_id, "--request", stdout=io.StringIO())


def test_describe_shows_the_request() -> None:
    handle = client.start("tests.x.carries_on", args=["desc"])
    assert handle.describe()["cancel_request"] is None
    park(handle.run_id)
    handle.cancel("why", mode="request")
    pending = handle.describe()["cancel_request"]
    assert pending["reason"] == "why" and pending["seq"] is None and pending["requested_at"]
    drive(handle.run_id)
    assert handle.describe()["cancel_request"]["seq"] == 1


def test_bulk_request_cancel_sends_each_run_a_request() -> None:
    handles = [client.start("tests.x.saga", args=[f"bulk{i}"]) for i in range(3)]
    for handle in handles:
        park(handle.run_id)
    done = client.start("tests.echo")
    drive(done.run_id)
    outcome = runtime.apply_bulk(
        "request_cancel", [h.run_id for h in handles] + [done.run_id], reason="cleanup"
    )
    assert sorted(outcome.changed_ids) == sorted(h.run_id for h in handles)
    assert list(outcome.skipped) == ["already finished (completed)"]
    for handle in handles:
        assert run_of(handle.run_id).cancel_request["reason"] == "cleanup"
        assert drive(handle.run_id) == "cancelled"


# -- the hot path --------------------------------------------------------------------------------


def test_a_turn_of_a_run_without_a_request_makes_no_more_queries(on_postgres: bool) -> None:
    """The claim returns the request with the run, and the park reads it with the row lock
    it takes anyway: a run without a request makes the same statements as before
    requests existed (these figures were measured on the code before them)."""
    handle = client.start("tests.x.steps_then_sleep", kwargs={"steps": 5})
    engine = make_engine()
    with CaptureQueriesContext(connection) as first:
        assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED
    time.sleep(0.3)
    tick()
    with CaptureQueriesContext(connection) as second:
        assert engine.run_turn(handle.run_id) == TurnOutcome.COMPLETED
    statements = [query["sql"] for query in [*first, *second]]
    # PostgreSQL: claim, five step commits, park (BEGIN, lock, start step, timer,
    # unanswerable updates, park, COMMIT) / claim, history, the sleep's end and four step
    # commits, the finish that records the fifth. SQLite: the same, with a terminal commit
    # of several statements.
    assert (len(first), len(second)) == ((13, 8) if on_postgres else (13, 14)), statements


def test_a_retry_that_removes_the_received_request_makes_it_pending_again() -> None:
    handle = client.start("tests.x.catches_then_fails", args=["rt"])
    park(handle.run_id)
    handle.cancel("first time", mode="request")
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED  # caught, waits again
    assert run_of(handle.run_id).cancel_request["seq"] == 2
    assert run_activity(handle.run_id, 0, 1) == ActivityOutcome.FAILED
    assert drive(handle.run_id) == "failed"
    assert run_of(handle.run_id).error["seq"] == 0

    handle.retry()  # removes every step from position 0, the request's entry among them
    request = run_of(handle.run_id).cancel_request
    assert request["seq"] is None and request["reason"] == "first time"
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    assert count("rt:caught") == 2  # received again at the same wait
    assert [kind for _, kind, _ in history(handle.run_id)] == [
        "activity",
        "wait",
        "cancel_request",
        "activity",
    ]


def test_a_child_with_a_pending_request_keeps_it_as_its_parents() -> None:
    parent = client.start("tests.x.parent", args=["pp"])
    engine = make_engine()
    engine.store.close_children = lambda run_id, reason: []  # type: ignore[method-assign]
    assert engine.run_turn(parent.run_id) == TurnOutcome.COMPLETED
    polite = WorkflowRun.objects.get(parent_id=parent.run_id, parent_close_policy="request_cancel")
    client.get_handle(str(polite.pk)).cancel("asked first", mode="request")
    DjangoStore().sweep.close_orphaned_children(100)  # the parent's request: one is pending already
    request = run_of(str(polite.pk)).cancel_request
    assert request["reason"] == "asked first" and request["from_parent"] is True
    assert str(polite.pk) not in DjangoStore().sweep.close_orphaned_children(100)


# -- update handlers ---------------------------------------------------------------------------


def test_a_request_received_while_an_update_handler_waits_to_retry_reaches_the_workflow() -> None:
    """A handler runs at the body's blocking point; a request it receives (at its activity's
    durable retry) fails its update and goes on into the body, on replay as live."""
    handle = client.start("tests.m.retrying_update", args=["hr"])
    park(handle.run_id)
    with pytest.raises(UpdateTimeout) as caught:
        handle.update("charge", wait=0)
    park(handle.run_id)  # the handler's first attempt failed; it waits for its retry
    assert count("hr:attempt1") == 1
    assert handle.cancel("stop", mode="request") == "running"
    assert drive(handle.run_id) == "cancelled"
    assert count("hr:cleanup") == 1 and count("hr:attempt2") == 0
    assert Step.objects.get(run_id=handle.run_id, seq=1).result["outcome"]["cancellation_passed_on"] is True
    assert history(handle.run_id) == [
        (0, "signal", "waiting"),
        (1, "handler", "completed"),  # the update, answered
        (2, "activity", "retrying"),  # the handler's activity, its retry abandoned
        (3, "cancel_request", "completed"),
        (4, "activity", "completed"),  # the workflow's clean-up
    ]
    update = Update.objects.get(update_id=caught.value.update_id)
    assert update.status == "failed" and update.error["type"].endswith(".CancellationRequested")
    with pytest.raises(WorkflowCancelled):
        handle.result(timeout=1)
    assert run_of(handle.run_id).error["message"] == "cancelled on request: stop"
    (replayed,) = runtime.replay_runs(runtime.RunSelection(refs=(handle.run_id,)))
    assert replayed.verdict == "ok" and replayed.result.end == "raised"  # the same history again


def test_a_history_whose_update_handler_kept_the_request_replays_as_it_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Recorded by code that let the handler keep the request (its update's outcome has no
    ``cancellation_passed_on``): the workflow went on, and replay must not raise it."""
    handle = client.start("tests.m.retrying_update", args=["old"])
    park(handle.run_id)
    with pytest.raises(UpdateTimeout):
        handle.update("charge", wait=0)
    park(handle.run_id)
    handle.cancel("stop", mode="request")
    current = MessageHandling._call_update_handler

    def kept(self: MessageHandling, *args: Any) -> Any:
        ok, value, _ = current(self, *args)
        return ok, value, None  # the earlier code: the handler's failure, nothing passed on

    monkeypatch.setattr(MessageHandling, "_call_update_handler", kept)
    park(handle.run_id)  # the workflow went on waiting for "go"
    monkeypatch.undo()
    assert "cancellation_passed_on" not in Step.objects.get(run_id=handle.run_id, seq=1).result["outcome"]
    handle.signal("go")
    assert drive(handle.run_id) == "completed" and handle.result(timeout=1) == "done"
    assert count("old:cleanup") == 0
    (replayed,) = runtime.replay_runs(runtime.RunSelection(refs=(handle.run_id,)))
    assert replayed.verdict == "ok" and replayed.result.end == "returned"
