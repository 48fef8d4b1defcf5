"""Signals, updates and queries: talking to running workflows."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from django_weft import (
    PayloadError,
    UnknownHandler,
    UpdateFailed,
    UpdateTimeout,
    UpdateValidationError,
    WorkflowNotFound,
    WorkflowTerminalError,
    client,
)
from django_weft.engine import faults
from django_weft.engine.errors import InvalidInput
from django_weft.engine.executor import TurnOutcome
from django_weft.engine.records import StepWrite
from django_weft.models import Signal, Step, Timer, Update, WorkflowRun
from django_weft.store import DjangoStore
from django_weft.testing import drive, make_engine
from tests.support.driver import Driver, park
from tests.support.threads import in_threads
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def table_snapshot(run_id: str) -> dict[str, Any]:
    """Everything a read-only operation must leave unchanged."""
    run = WorkflowRun.objects.filter(pk=run_id).values().get()
    return {
        "run": run,
        "steps": list(Step.objects.filter(run_id=run_id).order_by("seq").values()),
        "timers": list(Timer.objects.order_by("pk").values()),
        "signals": list(Signal.objects.order_by("pk").values()),
        "updates": list(Update.objects.order_by("pk").values()),
        "side_effects": SideEffect.objects.count(),
    }


# -- signals ---------------------------------------------------------------------------


def test_signals_sent_before_the_wait_are_buffered_and_consumed_in_order() -> None:
    handle = client.start("tests.m.collect", args=["x", 3])
    for n in range(3):
        handle.signal("x", {"n": n})
    assert drive(handle.run_id) == "completed"
    assert handle.result() == [{"n": 0}, {"n": 1}, {"n": 2}]
    signals = Signal.objects.filter(run_id=handle.run_id).order_by("pk")
    consumed = list(signals.values_list("consumed_seq", flat=True))
    assert consumed == [0, 1, 2]
    history = handle.history()
    assert [(h["kind"], h["name"], h["result"]["payload"]) for h in history] == [
        ("signal", "x", {"n": n}) for n in range(3)
    ]


def test_a_signal_wakes_the_parked_run_and_is_consumed_there() -> None:
    handle = client.start("tests.m.collect", args=["x", 1])
    park(handle.run_id)
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.waiting_on["kind"] == "signal" and run.waiting_on["signals"] == ["x"]
    handle.signal("other")  # not waited for: buffered, the run stays parked
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "waiting"
    handle.signal("x", "hello")
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.status == "running" and run.owner_id is None and run.ready_at is not None
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    assert handle.result() == ["hello"]
    assert Signal.objects.get(run_id=handle.run_id, name="other").consumed_seq is None


def test_a_signal_that_arrives_while_the_turn_runs_is_not_lost() -> None:
    """The signal commits after the turn looked at the buffer and before it parks: the park
    sees it (both lock the run row) and leaves the run runnable."""
    handle = client.start("tests.m.collect", args=["x", 1])

    def send_during_turn(_context: dict[str, Any]) -> None:
        thread = threading.Thread(target=lambda: (handle.signal("x", "late"), connection.close()))
        thread.start()
        thread.join(10)

    faults.arm("before_park", send_during_turn)
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    faults.disarm()
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.status == "running" and run.owner_id is None, "the run parked past a pending signal"
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    assert handle.result() == ["late"]


def test_a_repeated_signal_id_is_accepted_once_and_consumed_once() -> None:
    handle = client.start("tests.m.collect", args=["x", 2])
    first = handle.signal("x", "a", signal_id="s-1")
    again = handle.signal("x", "a (again)", signal_id="s-1")
    other = handle.signal("x", "b", signal_id="s-2")
    assert not first.duplicate and again.duplicate
    assert again.sequence == first.sequence and again.received_at == first.received_at
    assert other.sequence > first.sequence
    assert Signal.objects.filter(run_id=handle.run_id).count() == 2
    assert drive(handle.run_id) == "completed"
    assert handle.result() == ["a", "b"]


@pytest.mark.postgres
def test_concurrent_repeats_of_a_signal_id_store_one_signal() -> None:
    handle = client.start("tests.m.collect", args=["x", 1])
    barrier = threading.Barrier(8)

    def send(_: int) -> Any:
        barrier.wait(10)
        return handle.signal("x", "once", signal_id="same")

    results = in_threads(send, 8, timeout=30)
    assert len(results) == 8
    assert len({r.sequence for r in results}) == 1
    assert sum(not r.duplicate for r in results) == 1
    assert Signal.objects.filter(run_id=handle.run_id).count() == 1


def test_a_signal_to_a_finished_run_is_refused_and_stores_nothing() -> None:
    handle = client.start("tests.echo", args=[1])
    assert drive(handle.run_id) == "completed"
    with pytest.raises(WorkflowTerminalError, match="completed"):
        handle.signal("x", "too late")
    assert Signal.objects.count() == 0
    with pytest.raises(WorkflowNotFound):
        client.get_handle("no-such-run").signal("x")


def test_bad_signal_input_is_refused_with_what_to_fix(settings: Any) -> None:
    handle = client.start("tests.m.collect", args=["x", 1])
    settings.WEFT_MAX_PAYLOAD_BYTES = 100
    with pytest.raises(PayloadError, match="100"):
        handle.signal("x", "y" * 200)
    with pytest.raises(PayloadError):
        handle.signal("x", {1, 2})
    with pytest.raises(InvalidInput, match="non-empty"):
        handle.signal("")
    with pytest.raises(InvalidInput, match="signal_id"):
        handle.signal("x", signal_id="")
    with pytest.raises(InvalidInput, match="limit is 200"):
        handle.signal("x" * 201)
    assert Signal.objects.count() == 0


def test_wait_signal_times_out_durably_and_a_signal_in_time_wins() -> None:
    late = client.start("tests.m.wait_with_timeout", args=[0.3])
    park(late.run_id)
    timer = Timer.objects.get(run_id=late.run_id)
    assert timer.kind == "signal_timeout"
    assert drive(late.run_id) == "completed"
    assert late.result() == "timed out"
    with pytest.raises(WorkflowTerminalError):
        late.signal("go", "after the end")

    in_time = client.start("tests.m.wait_with_timeout", args=[30])
    park(in_time.run_id)
    in_time.signal("go", "now")
    assert drive(in_time.run_id) == "completed"
    assert in_time.result() == "got now"
    # The consumed wait removed its timeout timer: nothing wakes the run later.
    assert not Timer.objects.filter(run_id=in_time.run_id).exists()


@pytest.mark.postgres
def test_a_thousand_signals_from_eight_threads_are_each_consumed_once_in_sender_order(driver: Driver) -> None:
    senders, per_sender = 8, 125
    handle = client.start("tests.m.collect", args=["tick", senders * per_sender])

    def send(sender: int) -> None:
        for n in range(per_sender):
            handle.signal("tick", {"sender": sender, "n": n})

    in_threads(send, senders, timeout=120)
    received = handle.result(timeout=120)
    assert len(received) == senders * per_sender
    assert len({(r["sender"], r["n"]) for r in received}) == senders * per_sender  # each exactly once
    for sender in range(senders):
        assert [r["n"] for r in received if r["sender"] == sender] == list(range(per_sender))
    assert not Signal.objects.filter(run_id=handle.run_id, consumed_seq__isnull=True).exists()
    steps = Step.objects.filter(run_id=handle.run_id, kind="signal")
    assert steps.count() == senders * per_sender
    consumed_at = dict(Signal.objects.filter(run_id=handle.run_id).values_list("pk", "consumed_seq"))
    # History order is arrival order: the signal rows were numbered under the run's lock.
    assert [consumed_at[pk] for pk in sorted(consumed_at)] == list(range(senders * per_sender))


# -- signal_with_start -----------------------------------------------------------------


def test_signal_with_start_starts_once_then_signals_the_live_run() -> None:
    first = client.signal_with_start("tests.m.collect", args=["x", 2], id="sws-1", signal="x", payload=1)
    second = client.signal_with_start("tests.m.collect", args=["x", 2], id="sws-1", signal="x", payload=2)
    assert first == second
    assert WorkflowRun.objects.filter(workflow_id="sws-1").count() == 1
    assert drive(first.run_id) == "completed"
    assert first.result() == [1, 2]
    third = client.signal_with_start("tests.m.collect", args=["x", 1], id="sws-1", signal="x", payload=3)
    assert third.run_id != first.run_id  # the first run finished: a new one is started
    assert drive(third.run_id) == "completed" and third.result() == [3]


@pytest.mark.postgres
def test_concurrent_signal_with_start_converges_on_one_run() -> None:
    barrier = threading.Barrier(6)

    def call(n: int) -> Any:
        barrier.wait(10)
        return client.signal_with_start(
            "tests.m.collect", args=["x", 6], id="sws-race", signal="x", payload=n
        )

    handles = in_threads(call, 6, timeout=30)
    assert len({h.run_id for h in handles}) == 1
    assert drive(handles[0].run_id) == "completed"
    assert sorted(handles[0].result()) == list(range(6))


def test_signal_with_start_validates_everything_before_writing() -> None:
    with pytest.raises(InvalidInput):
        client.signal_with_start("tests.m.collect", args=["x", 1], id="", signal="x")
    with pytest.raises(InvalidInput):
        client.signal_with_start("tests.m.collect", args=["x", 1], id="sws-bad", signal="")
    assert WorkflowRun.objects.count() == 0 and Signal.objects.count() == 0


# -- queries ---------------------------------------------------------------------------


def test_a_query_on_a_waiting_run_returns_its_state_and_changes_nothing() -> None:
    handle = client.start("tests.m.cart", args=["q"])
    park(handle.run_id)
    for item in ("apple", "pear"):
        handle.signal("add", item)
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED  # the handler ran
    before = table_snapshot(handle.run_id)
    assert handle.query("state") == {"items": ["apple", "pear"], "address": None, "closed": False}
    assert handle.query("count", 10) == 12
    assert table_snapshot(handle.run_id) == before


def test_a_query_never_runs_an_activity() -> None:
    handle = client.start("tests.m.query_guard", args=["g"])
    # Before any turn: the replay stops at the first activity, which it does not run.
    assert handle.query("stage") == "started"
    assert SideEffect.objects.count() == 0
    park(handle.run_id)
    assert handle.query("stage") == "waiting"
    accepted = handle.signal("go")
    # A worker claims the run and consumes the signal; a query now, while it drives the
    # run, replays up to the activity that must not run in a query.
    store = DjangoStore()
    owned = store.turns.claim(handle.run_id, "engine-x", 30, 0)
    assert owned is not None
    now = owned.db_now
    result = json.dumps({"signal": accepted.sequence, "payload": None})
    step = StepWrite(1, "signal", "go", "completed", None, result, None, 1, now, now)
    store.turns.finish_wait(handle.run_id, "engine-x", owned.epoch, step, signal_pk=accepted.sequence)
    before = table_snapshot(handle.run_id)
    assert handle.query("stage") == "running bomb"
    assert table_snapshot(handle.run_id) == before
    assert not SideEffect.objects.filter(key="bomb:g").exists()


def test_an_unknown_query_lists_the_registered_ones() -> None:
    handle = client.start("tests.m.cart", args=["q"])
    with pytest.raises(UnknownHandler, match="registered query handlers: count, state") as caught:
        handle.query("nope")
    assert caught.value.registered == ["count", "state"]


def test_weft_query_and_weft_signal_commands(capsys: Any) -> None:
    handle = client.start("tests.m.collect", args=["x", 2])
    call_command("weft_signal", handle.run_id, "x", "--payload", '{"n": 1}', "--signal-id", "cmd-1")
    call_command("weft_signal", handle.workflow_id, "x", "--payload", '{"n": 1}', "--signal-id", "cmd-1")
    out = capsys.readouterr().out
    assert "accepted" in out and "already accepted before" in out
    park_or_run = make_engine().run_turn(handle.run_id)
    assert park_or_run == TurnOutcome.PARKED
    call_command("weft_query", handle.run_id, "received")
    assert '"n": 1' in capsys.readouterr().out
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="JSON"):
        call_command("weft_signal", handle.run_id, "x", "--payload", "{not json")
    with pytest.raises(CommandError, match="registered query handlers: received"):
        call_command("weft_query", handle.run_id, "nope")


# -- updates ---------------------------------------------------------------------------


def test_a_rejected_update_writes_nothing_and_returns_the_issues() -> None:
    handle = client.start("tests.m.cart", args=["u"])
    park(handle.run_id)
    before = table_snapshot(handle.run_id)
    with pytest.raises(UpdateValidationError, match="city is required") as caught:
        handle.update("address", {"street": "Main St"}, wait=0)
    assert caught.value.issues == [{"field": None, "message": "city is required"}]
    assert table_snapshot(handle.run_id) == before
    assert Update.objects.count() == 0


def test_an_accepted_update_returns_the_handlers_result(driver: Driver) -> None:
    handle = client.start("tests.m.cart", args=["u"])
    handle.signal("add", "apple")
    result = handle.update("address", {"city": "Oslo"}, update_id="addr-1", wait=30)
    assert result == {"address": {"city": "Oslo"}, "items": 1}
    update = Update.objects.get(update_id="addr-1")
    assert update.status == "completed" and update.result == result and update.applied_seq is not None
    marker = Step.objects.get(run_id=handle.run_id, seq=update.applied_seq)
    assert (marker.kind, marker.name, marker.status) == ("handler", "update:address", "completed")
    # The same update_id again returns the stored outcome; the handler ran once.
    assert handle.update("address", {"city": "Oslo"}, update_id="addr-1", wait=30) == result
    assert SideEffect.objects.filter(key="u:address").count() == 1
    assert handle.query("state")["address"] == {"city": "Oslo"}
    assert handle.update("close", wait=30) == "closed"
    assert handle.result(timeout=30)["address"] == {"city": "Oslo"}


def test_an_update_that_times_out_can_be_polled_by_its_id() -> None:
    handle = client.start("tests.m.cart", args=["p"])
    park(handle.run_id)
    with pytest.raises(UpdateTimeout) as caught:
        handle.update("address", {"city": "Rome"}, wait=0)
    update_id = caught.value.update_id
    assert Update.objects.get(update_id=update_id).status == "accepted"
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "running"  # woken
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    assert handle.update_result(update_id) == {"address": {"city": "Rome"}, "items": 0}
    with pytest.raises(InvalidInput, match="was used for update 'address'"):
        handle.update("close", update_id=update_id, wait=0)


def test_an_update_handler_may_not_sleep_and_a_failing_handler_fails_only_the_update() -> None:
    handle = client.start("tests.m.cart", args=["f"])
    park(handle.run_id)
    for name in ("nap", "broken"):
        with pytest.raises(UpdateTimeout) as caught:
            handle.update(name, wait=0)
        make_engine().run_turn(handle.run_id)
        with pytest.raises(UpdateFailed) as failed:
            handle.update_result(caught.value.update_id)
        if name == "nap":
            assert "may not sleep" in failed.value.error_message
        else:
            assert failed.value.error_type == "ZeroDivisionError"
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "waiting"  # the run goes on
    with pytest.raises(UpdateTimeout):
        handle.update("close", update_id="c", wait=0)
    assert drive(handle.run_id) == "completed"
    assert handle.update_result("c") == "closed"


def test_updates_to_finished_runs_and_unknown_names_are_refused() -> None:
    handle = client.start("tests.m.cart", args=["t"])
    park(handle.run_id)  # parked where its handlers are registered: an unknown name is refused at once
    with pytest.raises(UnknownHandler, match="registered update handlers: address, broken, close, nap"):
        handle.update("nope", wait=0)
    with pytest.raises(UpdateTimeout):
        handle.update("close", update_id="c", wait=0)
    assert drive(handle.run_id) == "completed"
    with pytest.raises(WorkflowTerminalError, match="completed"):
        handle.update("close", wait=0)
    assert handle.update_result("c") == "closed"  # a stored outcome stays readable
    assert Update.objects.count() == 1


def test_an_update_left_pending_when_the_run_finishes_is_failed() -> None:
    handle = client.start("tests.echo", args=[1])  # never blocks, so never applies it
    update = Update.objects.create(run_id=handle.run_id, update_id="orphan", name="missing")
    assert drive(handle.run_id) == "completed"
    update.refresh_from_db()
    assert update.status == "failed" and "finished (completed)" in update.error["message"]


# -- conditions and handlers while blocked ---------------------------------------------


def test_wait_condition_is_re_evaluated_after_each_handler() -> None:
    handle = client.start("tests.m.condition", args=[3])
    park(handle.run_id)
    for n in range(2):
        handle.signal("item", n)
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "waiting"
    for n in range(2, 5):
        handle.signal("item", n)
    assert drive(handle.run_id) == "completed"
    # Satisfied after the third signal: the other two stay buffered.
    assert handle.result() == {"ok": True, "seen": [0, 1, 2]}
    assert Signal.objects.filter(run_id=handle.run_id, consumed_seq__isnull=True).count() == 2


def test_wait_condition_times_out() -> None:
    handle = client.start("tests.m.condition", args=[2, 0.2])
    handle.signal("item", "only one")
    assert drive(handle.run_id) == "completed"
    assert handle.result() == {"ok": False, "seen": ["only one"]}


def test_handlers_run_while_the_workflow_sleeps_and_replay_reapplies_them() -> None:
    # The sleep outlasts the two turns below however slow the machine (they must find the
    # run still asleep); drive() then waits it out.
    handle = client.start("tests.m.sleep_with_handlers", args=[3.0])
    park(handle.run_id)
    handle.signal("note", "a")
    assert make_engine("second").run_turn(handle.run_id) == TurnOutcome.PARKED
    with pytest.raises(UpdateTimeout) as caught:
        handle.update("notes", wait=0)
    handle.signal("note", "b")
    assert make_engine("third").run_turn(handle.run_id) == TurnOutcome.PARKED
    assert handle.update_result(caught.value.update_id) == ["a"]
    assert drive(handle.run_id) == "completed"
    assert handle.result() == {"notes": ["a", "b"]}
    kinds = [(s["kind"], s["name"]) for s in handle.history()]
    assert kinds == [
        ("sleep", "sleep"),
        ("handler", "signal:note"),
        ("handler", "update:notes"),
        ("handler", "signal:note"),
    ]


def test_wait_signal_on_a_handled_name_is_a_clear_error() -> None:
    from django_weft import workflow

    @workflow(name="tests.m.conflict")
    def conflict(ctx: Any) -> None:
        ctx.on_signal("x", print)
        ctx.wait_signal("x")

    try:
        handle = client.start("tests.m.conflict")
        assert drive(handle.run_id) == "failed"
        assert "has a handler" in WorkflowRun.objects.get(pk=handle.run_id).error["message"]
    finally:
        from django_weft.engine.registry import registry

        registry.unregister("tests.m.conflict")


# -- validators ------------------------------------------------------------------------


def issues_of(validator: Any, payload: Any) -> list[dict[str, Any]]:
    from django_weft.runtime.validation import validate_payload

    try:
        validate_payload(validator, payload, what="the validator")
    except UpdateValidationError as exc:
        assert "rejected the payload" in exc.message
        return exc.issues
    return []


def test_a_drf_serializer_validates_per_field() -> None:
    from rest_framework import serializers

    class Address(serializers.Serializer):  # type: ignore[type-arg]
        city = serializers.CharField()
        zip = serializers.RegexField(r"^\d{4}$")

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            if attrs["city"] == "Nowhere":
                raise serializers.ValidationError("no deliveries to Nowhere")
            return attrs

    class Order(serializers.Serializer):  # type: ignore[type-arg]
        address = Address()

    assert issues_of(Address, {"city": "Oslo", "zip": "0150"}) == []
    assert issues_of(Address, {"zip": "abc"}) == [
        {"field": "city", "message": "This field is required."},
        {"field": "zip", "message": "This value does not match the required pattern."},
    ]
    assert issues_of(Address, {"city": "Nowhere", "zip": "1234"}) == [
        {"field": None, "message": "no deliveries to Nowhere"}
    ]
    assert issues_of(Order, {"address": {"city": "Oslo"}}) == [
        {"field": "address.zip", "message": "This field is required."}
    ]


def test_a_pydantic_model_validates_per_field() -> None:
    from pydantic import BaseModel

    class Address(BaseModel):
        city: str
        floor: int = 0

    assert issues_of(Address, {"city": "Oslo", "floor": 3}) == []
    issues = issues_of(Address, {"floor": "high"})
    assert [issue["field"] for issue in issues] == ["city", "floor"]
    assert all(issue["message"] for issue in issues)


def test_callable_validators_raise_what_they_reject() -> None:
    from django.core.exceptions import ValidationError
    from rest_framework import serializers

    def django_style(payload: Any) -> None:
        raise ValidationError({"city": ["Enter a city."]})

    def drf_style(payload: Any) -> None:
        raise serializers.ValidationError({"zip": ["Bad zip."]})

    def plain(payload: Any) -> None:
        if payload != "ok":
            raise ValueError("say ok")

    assert issues_of(django_style, {}) == [{"field": "city", "message": "Enter a city."}]
    assert issues_of(drf_style, {}) == [{"field": "zip", "message": "Bad zip."}]
    assert issues_of(plain, "ok") == []
    assert issues_of(plain, "no") == [{"field": None, "message": "say ok"}]


# -- replay positions and failure modes ------------------------------------------------


def test_a_handler_applied_at_the_second_of_two_waits_replays_there() -> None:
    from django_weft.runtime import run_activity

    handle = client.start("tests.m.two_waits", args=["tw"])
    engine = make_engine()
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED  # at first.result()
    run_activity(handle.run_id, 0, 1)
    handle.signal("approve")
    # first.result() returns (not approved yet), the handler runs at second.result().
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED
    run_activity(handle.run_id, 1, 1)
    assert engine.run_turn(handle.run_id) == TurnOutcome.COMPLETED
    assert handle.result() == {"seen_after_first": False, "approved": True}
    assert not SideEffect.objects.filter(key="tw:seen").exists()
    assert [(s["kind"], s["name"]) for s in handle.history()] == [
        ("activity", "tests.m.q_echo"),
        ("activity", "tests.m.q_echo"),
        ("wait", "wait_all"),
        ("handler", "signal:approve"),
    ]


def test_wait_any_records_its_start_before_a_handler() -> None:
    from django_weft.runtime import run_activity

    handle = client.start("tests.m.any_with_handler")
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    handle.signal("note", "n1")
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    assert [(s["kind"], s["name"], s["status"]) for s in handle.history()] == [
        ("activity", "tests.m.q_echo", "scheduled"),
        ("wait", "wait_any", "waiting"),
        ("handler", "signal:note", "completed"),
    ]
    run_activity(handle.run_id, 0, 1)
    assert drive(handle.run_id) == "completed"
    assert handle.result() == {"notes": ["n1"], "result": "done"}


def test_non_determinism_inside_an_update_handler_holds_the_run_and_leaves_the_update_unanswered() -> None:
    from tests.testapp import workflows

    handle = client.start("tests.m.changing_update", args=["cu"])
    park(handle.run_id)
    with pytest.raises(UpdateTimeout):
        handle.update("bump", update_id="u1", wait=0)

    class Crash(BaseException):
        pass

    def crash(_context: dict[str, Any]) -> None:
        raise Crash

    faults.arm("before_update_answer", crash)
    with pytest.raises(Crash):
        make_engine().run_turn(handle.run_id)
    faults.disarm()
    WorkflowRun.objects.filter(pk=handle.run_id).update(owner_id=None, lease_expires_at=None)
    workflows.update_handler_activity["name"] = "tests.noop"  # a deploy changed the handler
    try:
        assert make_engine().run_turn(handle.run_id) == TurnOutcome.FAILED
    finally:
        workflows.update_handler_activity["name"] = "tests.record"
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.failure_category == "nondeterminism"
    update = Update.objects.get(update_id="u1")
    # Not answered "failed" by the held run (a retry after the fix applies it), but failed
    # as unanswered when the run ended.
    assert update.status == "failed" and update.error["type"] == "django_weft.RunFinished"


def test_signals_keep_their_order_whatever_the_senders_clocks_say() -> None:
    from datetime import timedelta

    handle = client.start("tests.m.collect", args=["x", 2])
    first, second = handle.signal("x", 1), handle.signal("x", 2)
    Update.objects.create(run_id=handle.run_id, update_id="u", name="n")
    # The first sender's clock ran a second ahead of the second's.
    Signal.objects.filter(pk=first.sequence).update(received_at=second.received_at + timedelta(seconds=1))
    pending = DjangoStore().turns.pending_messages(handle.run_id)
    signals = [message.payload for message in pending if message.kind == "signal"]
    assert signals == [1, 2]


def test_a_query_handler_that_calls_a_workflow_operation_fails_clearly() -> None:
    from django_weft import QueryFailed

    handle = client.start("tests.m.query_uses_ctx")
    park(handle.run_id)
    with pytest.raises(QueryFailed, match="may only read the workflow's state"):
        handle.query("now")


def test_update_result_of_an_unknown_update_id_is_a_lookup_error() -> None:
    from django_weft import UpdateNotFound

    handle = client.start("tests.m.cart", args=["n"])
    with pytest.raises(UpdateNotFound):
        handle.update_result("nope")


# -- updates sent before the run has registered its handler ------------------------------


def test_an_update_sent_right_after_the_start_is_applied_when_the_run_gets_there(driver: Driver) -> None:
    """No sleep between start and update: the run has not registered its handler yet."""
    handle = client.start("tests.m.cart", args=["early"])
    assert handle.update("address", {"city": "Oslo"}, wait=20) == {"address": {"city": "Oslo"}, "items": 0}
    assert handle.update("close", wait=20) == "closed"
    assert handle.result(timeout=20)["address"] == {"city": "Oslo"}


def test_an_early_update_with_no_handler_is_refused_once_the_run_blocks(driver: Driver) -> None:
    handle = client.start("tests.m.cart", args=["early-unknown"])
    with pytest.raises(UnknownHandler, match="no handler for update 'nope'") as caught:
        handle.update("nope", {"x": 1}, wait=20)
    assert caught.value.registered == ["address", "broken", "close", "nap"]
    # Refused by the run where it blocked, or (if it had parked already) before being stored.
    assert list(Update.objects.filter(name="nope").values_list("status", flat=True)) in (["failed"], [])
    handle.update("close", wait=20)
    assert handle.result(timeout=20)["closed"] is True


def test_an_early_update_the_validator_rejects_is_refused_and_not_applied(driver: Driver) -> None:
    handle = client.start("tests.m.cart", args=["early-invalid"])
    with pytest.raises(UpdateValidationError, match="city is required") as caught:
        handle.update("address", {"street": "Storgata 1"}, wait=20)
    assert caught.value.issues == [{"field": None, "message": "city is required"}]
    assert not SideEffect.objects.filter(key="early-invalid:address").exists()  # the handler never ran
    assert handle.query("state")["address"] is None
    handle.update("close", wait=20)
    handle.result(timeout=20)


def test_an_update_to_a_parked_run_that_its_validator_rejects_still_writes_nothing() -> None:
    handle = client.start("tests.m.cart", args=["parked-invalid"])
    park(handle.run_id)
    before = (Update.objects.count(), Step.objects.count())
    with pytest.raises(UpdateValidationError):
        handle.update("address", {"street": "x"}, wait=0)
    assert (Update.objects.count(), Step.objects.count()) == before


def test_an_early_update_is_refused_when_the_run_blocks_with_no_handlers_at_all() -> None:
    handle = client.start("tests.sleepy", kwargs={"seconds": 60})
    with pytest.raises(UpdateTimeout) as accepted:
        handle.update("nope", {"x": 1}, wait=0)
    park(handle.run_id)  # blocks in ctx.sleep, with no update handler registered
    with pytest.raises(UnknownHandler, match="no handler for update 'nope'") as caught:
        handle.update_result(accepted.value.update_id)
    assert caught.value.registered == []
    assert Update.objects.get().status == "failed"


def test_an_early_update_meeting_a_run_that_parked_meanwhile_is_refused_and_not_stored() -> None:
    """The caller's check saw the run runnable; the run parked before the update was
    stored: the store, under the run's row lock, refuses a name the parked run lacks."""
    handle = client.start("tests.m.cart", args=["raced"])
    park(handle.run_id)
    store = DjangoStore()
    run_pk = WorkflowRun.objects.get().pk
    with pytest.raises(UnknownHandler, match="'nope'"), transaction.atomic():
        store.intake.accept_update(run_pk, "u-1", "nope", None, dispatched=False, validated=False)
    assert not Update.objects.exists()
    with transaction.atomic():
        stored, created, woken = store.intake.accept_update(
            run_pk, "u-2", "close", None, dispatched=False, validated=False
        )
    assert created and woken and stored.validated is False  # known there: the run checks it


def test_a_run_suspended_before_it_blocked_takes_an_early_update_and_decides_later() -> None:
    handle = client.start("tests.m.cart", args=["suspended-early"])
    handle.suspend()  # never ran: suspended with nothing known of its handlers
    with pytest.raises(UpdateTimeout) as accepted:
        handle.update("nope", wait=0)
    handle.resume()
    park(handle.run_id)
    with pytest.raises(UnknownHandler):
        handle.update_result(accepted.value.update_id)
