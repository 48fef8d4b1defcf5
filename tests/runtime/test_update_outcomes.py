"""Messages whose run ends, continues or is retried around them: a caller never waits
forever for an update its run left unanswered, a retried run applies again the updates
the steps it removed had applied, and a message sent to a workflow id whose run continued
as new meanwhile reaches the successor."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest
from django.db import connections, transaction

from django_weft import RetryPolicy, UpdateFailed, UpdateTimeout, activity, client, workflow
from django_weft.engine.executor import TurnOutcome
from django_weft.models import Update, WorkflowRun
from django_weft.store import DjangoStore
from django_weft.testing import drive, make_engine

pytestmark = pytest.mark.django_db(transaction=True)

_in_body = threading.Event()
_go_on = threading.Event()


@workflow(name="tests.uo.finishing")
def finishing(ctx: Any) -> str:
    """Takes an update "close" while its first turn is held in its body."""
    ctx.on_update("close", lambda payload: "closed")
    if not ctx.is_replaying:
        _in_body.set()
        _go_on.wait(30)
    return "done"


def test_an_update_accepted_while_the_run_finishes_is_answered_not_left_pending() -> None:
    _in_body.clear()
    _go_on.clear()
    handle = client.start("tests.uo.finishing")
    outcome: list[TurnOutcome] = []

    def worker() -> None:
        try:
            outcome.append(make_engine("finisher").run_turn(handle.run_id))
        finally:
            connections.close_all()

    thread = threading.Thread(target=worker)
    thread.start()
    assert _in_body.wait(30)
    # The update is accepted under the run's row lock while the run's last statement
    # starts and waits for that lock: the run was still running when it was accepted.
    with transaction.atomic():
        stored, created, _ = DjangoStore().intake.accept_update(
            WorkflowRun.objects.get(pk=handle.run_id).pk, "late", "close", None, dispatched=False
        )
        assert created
        _go_on.set()
        time.sleep(0.5)
    thread.join(30)
    assert outcome == [TurnOutcome.COMPLETED]
    # Its caller gets the answer an update pending at the finish gets, at once.
    with pytest.raises(UpdateFailed, match="the run finished"):
        handle.update_result("late", wait=5)
    assert Update.objects.get(pk=stored.pk).status == "failed"


_fail_first: dict[str, bool] = {}


@activity(name="tests.uo.flaky", queue="tests", retry=RetryPolicy(max_attempts=1))
def flaky(key: str) -> str:
    if not _fail_first.get(key):
        _fail_first[key] = True
        raise RuntimeError("the first attempt fails")
    return "ok"


@workflow(name="tests.uo.collecting")
def collecting(ctx: Any, key: str) -> list[Any]:
    """Applies updates "add" while it waits for a queued activity."""
    applied: list[Any] = []

    def add(payload: Any) -> str:
        applied.append(payload)
        return "added"

    ctx.on_update("add", add)
    ctx.wait_all([ctx.start(flaky, key)])
    return applied


def test_a_retried_run_applies_again_the_updates_its_removed_steps_had_applied() -> None:
    _fail_first.clear()
    handle = client.start("tests.uo.collecting", args=["k"])
    engine = make_engine("retrier")
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED
    with pytest.raises(UpdateTimeout):
        handle.update("add", {"n": 1}, update_id="u1", wait=0)
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED
    assert handle.update_result("u1") == "added"
    assert drive(handle.run_id) == "failed"  # the queued activity failed for good
    handle.retry()
    assert drive(handle.run_id) == "completed"
    # The update its caller was answered is in the run's state.
    assert handle.result() == [{"n": 1}]
    assert handle.update_result("u1") == "added"


@workflow(name="tests.uo.rolls_over")
def rolls_over(ctx: Any, round: int = 0) -> str:
    """Continues as new once; its successor takes "ping" updates and waits for "go"."""
    if round == 0:
        ctx.continue_as_new(1)
    ctx.on_update("ping", lambda payload: "pong")
    ctx.wait_signal("go")
    return "went"


def test_a_message_to_a_workflow_id_whose_run_continued_meanwhile_reaches_its_successor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_weft.runtime import messages

    first = client.start("tests.uo.rolls_over", id="rolling")
    assert make_engine("roller").run_turn(first.run_id) == TurnOutcome.CONTINUED
    looked_up = WorkflowRun.objects.get(pk=first.run_id)
    assert looked_up.status == "continued"
    looked_up.status = "running"  # as the sender read it, a moment before it continued
    real = messages.get_run
    for send in (
        lambda: client.get_handle("rolling").signal("go"),
        lambda: client.get_handle("rolling").update("ping", update_id="p", wait=0),
    ):
        stale = iter([looked_up])
        monkeypatch.setattr(
            messages, "get_run", lambda ref, stale=stale, **kw: next(stale, None) or real(ref, **kw)
        )
        with contextlib.suppress(UpdateTimeout):
            send()
    successor = WorkflowRun.objects.get(workflow_id="rolling", status__in=["pending", "running"])
    assert successor.signals.filter(name="go").count() == 1
    assert Update.objects.filter(run=successor, update_id="p").exists()
    assert drive(str(successor.pk)) == "completed"


def test_an_update_waited_for_inside_a_transaction_says_why_it_could_not_be_applied() -> None:
    handle = client.start("tests.uo.finishing")
    with transaction.atomic(), pytest.raises(UpdateTimeout, match="inside a transaction") as caught:
        handle.update("close", update_id="in-atomic", wait=0.2)
    assert caught.value.update_id == "in-atomic"
    with pytest.raises(UpdateTimeout) as plain:  # outside one, the plain message
        handle.update("close", update_id="outside", wait=0.2)
    assert "inside a transaction" not in str(plain.value)
