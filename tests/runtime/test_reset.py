"""Reset a run to a position of its history: a new run of the workflow id replays the
entries before it and continues live; the old run is closed (if open) and linked."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_weft import UpdateTimeout, WorkflowNotRegistered, client, runtime
from django_weft.engine import faults
from django_weft.engine.errors import InvalidInput, InvalidTransition, WorkflowArgumentsError
from django_weft.engine.executor import TurnOutcome
from django_weft.models import Signal, Step, Timer, Update, WorkflowRun
from django_weft.testing import drive, make_engine
from tests.support.driver import park
from tests.support.threads import in_threads
from tests.testapp import workflows
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _step_6_broken() -> Iterator[None]:
    workflows.reset_bugs["step_6"] = True
    yield
    workflows.reset_bugs["step_6"] = True


def executions(key: str) -> int:
    return SideEffect.objects.filter(key=key).count()


def rows() -> dict[str, int]:
    """How many rows each table holds: a refused reset changes none."""
    tables = (WorkflowRun, Step, Signal, Update, Timer, SideEffect)
    return {model.__name__: model.objects.count() for model in tables}


def run_of(handle: Any) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=handle.run_id)


def failed_ten_steps(key: str) -> client.WorkflowHandle:
    handle = client.start("tests.r.ten_steps", args=[key], id=f"order-{key}")
    assert drive(handle.run_id) == "failed"
    assert run_of(handle).error["seq"] == 6
    return handle


# -- the main use case -------------------------------------------------------------------


def test_reset_a_failed_run_after_the_fix_replays_the_steps_before_and_completes() -> None:
    old = failed_ten_steps("fix")
    assert [executions(f"fix:{i}") for i in range(10)] == [1] * 7 + [0] * 3
    workflows.reset_bugs["step_6"] = False  # the fix is deployed

    new = old.reset(5, reason="step 6 fixed")

    assert new.workflow_id == old.workflow_id and new.run_id != old.run_id
    assert drive(new.run_id) == "completed"
    assert new.result() == sum(range(10))
    # Steps 0-4 replayed (not executed again); 5 and 6 ran again, 7-9 for the first time.
    assert [executions(f"fix:{i}") for i in range(10)] == [1] * 5 + [2, 2] + [1] * 3
    old_run, new_run = run_of(old), run_of(new)
    assert old_run.status == "failed"  # a finished run keeps its own outcome
    assert old_run.reset_to["run_id"] == new.run_id and old_run.reset_to["seq"] == 5
    assert new_run.reset_from["run_id"] == old.run_id and new_run.reset_from["reason"] == "step 6 fixed"
    assert old.describe()["reset_to"] == old_run.reset_to
    assert new.describe()["reset_from"] == new_run.reset_from and new.describe()["reset_to"] is None
    assert old.read().reset_to == old_run.reset_to

    # The copied entries are the old ones, times and all.
    def entries(run: WorkflowRun) -> list[tuple[Any, ...]]:
        steps = Step.objects.filter(run=run, seq__lt=5).order_by("seq")
        return list(steps.values_list("seq", "kind", "name", "status", "result", "started_at", "finished_at"))

    assert entries(new_run) == entries(old_run)
    # The workflow id now names the new run.
    assert client.get_handle(old.workflow_id).run_id == new.run_id


def test_reset_to_zero_runs_everything_again_and_new_input_replaces_the_old() -> None:
    old = failed_ten_steps("zero")
    workflows.reset_bugs["step_6"] = False
    new = old.reset(0, args=["zero-again"], reason="start over under another key")
    assert drive(new.run_id) == "completed"
    assert run_of(new).args == ["zero-again"]
    assert [executions(f"zero-again:{i}") for i in range(10)] == [1] * 10
    assert executions("zero:0") == 1


def test_the_command_resets_and_refuses_with_the_reason() -> None:
    old = failed_ten_steps("cmd")
    workflows.reset_bugs["step_6"] = False
    with pytest.raises(CommandError, match="past the end of the history"):
        call_command("weft_reset", old.workflow_id, "--to-seq", "12", "--reason", "typo")
    with pytest.raises(CommandError, match="needs a reason"):
        call_command("weft_reset", old.workflow_id, "--to-seq", "5", "--reason", " ")
    call_command("weft_reset", old.workflow_id, "--to-seq", "5", "--reason", "step 6 fixed")
    new = client.get_handle(old.workflow_id)
    assert new.run_id != old.run_id and run_of(new).reset_from["run_id"] == old.run_id
    assert drive(new.run_id) == "completed"


def test_new_input_can_be_given_as_json_to_the_command() -> None:
    old = failed_ten_steps("cmd-args")
    workflows.reset_bugs["step_6"] = False
    with pytest.raises(CommandError, match="--args"):
        call_command("weft_reset", old.run_id, "--to-seq", "0", "--reason", "x", "--args", "{not json")
    call_command("weft_reset", old.run_id, "--to-seq", "0", "--reason", "x", "--args", '["cmd-args-2"]')
    assert run_of(client.get_handle(old.workflow_id)).args == ["cmd-args-2"]


# -- open runs: closed, fenced, linked ---------------------------------------------------


def test_reset_of_a_waiting_run_closes_it_and_redelivers_its_later_signals() -> None:
    old = client.start("tests.r.signals", args=["sig"], id="sig")
    old.signal("item", "a")
    old.signal("item", "b")
    park(old.run_id)  # a@0, got-0@1, b@2, got-1@3, waits at 4
    old.signal("item", "c")  # buffered: the run is woken, not driven
    before = run_of(old)

    new = old.reset(2, reason="redo from the second signal")

    closed = run_of(old)
    assert closed.status == "cancelled" and closed.failure_category == "cancellation"
    assert closed.error["type"] == "django_weft.Reset" and closed.error["reset_to"] == new.run_id
    assert "reset to position 2" in closed.error["message"]
    assert closed.owner_epoch == before.owner_epoch + 1 and closed.owner_id is None
    assert not Timer.objects.filter(run=closed, fired_at__isnull=True).exists()
    assert closed.finalizer is None
    # Kept: "a" consumed at 0. Again: "b" (consumed at 2) and "c" (buffered), in order.
    copied = Signal.objects.filter(run_id=new.run_id).order_by("id")
    assert list(copied.values_list("payload", "consumed_seq")) == [("a", 0), ("b", None), ("c", None)]
    assert drive(new.run_id) == "completed"
    assert new.result() == ["a", "b", "c"]
    assert (executions("sig:got-0"), executions("sig:got-1"), executions("sig:got-2")) == (1, 2, 1)
    # A caller waiting on the old run gets the outcome of the run that replaced it.
    assert old.result(timeout=5) == ["a", "b", "c"]


def test_a_reset_deposes_the_worker_driving_the_old_run(on_postgres: bool) -> None:
    old = client.start("tests.r.ten_steps", args=["race", 0.3], id="race")
    outcomes: list[TurnOutcome] = []

    def work() -> None:
        try:
            outcomes.append(make_engine("engine-A").run_turn(old.run_id))
        finally:
            connection.close()

    worker = threading.Thread(target=work)
    worker.start()
    deadline = time.monotonic() + 30
    while Step.objects.filter(run_id=old.run_id).count() < 3:
        assert time.monotonic() < deadline, "the worker did not get to step 3"
        time.sleep(0.01)

    new = old.reset(2, reason="reset under a running worker")
    recorded = Step.objects.filter(run_id=old.run_id).count()
    workflows.reset_bugs["step_6"] = False

    worker.join(30)
    assert outcomes == [TurnOutcome.DEPOSED]
    # Nothing the deposed worker did after the reset's commit was recorded.
    assert Step.objects.filter(run_id=old.run_id).count() == recorded
    assert run_of(old).status == "cancelled"
    assert drive(new.run_id) == "completed"
    assert [executions(f"race:{i}") for i in (0, 1)] == [1, 1]
    assert [executions(f"race:{i}") for i in range(7, 10)] == [1, 1, 1]


def test_of_two_resets_racing_one_wins_and_the_other_writes_nothing() -> None:
    old = failed_ten_steps("twice")
    workflows.reset_bugs["step_6"] = False
    start = threading.Barrier(2)

    def reset(index: int) -> str:
        position = (4, 5)[index]
        start.wait(10)
        try:
            return old.reset(position, reason=f"to {position}").run_id
        except InvalidTransition as exc:
            return exc.message

    outcomes = in_threads(reset, 2, timeout=30)
    runs = WorkflowRun.objects.filter(workflow_id=old.workflow_id)
    assert runs.count() == 2, outcomes
    new = runs.exclude(pk=old.run_id).get()
    assert len(outcomes) == 2 and str(new.pk) in outcomes
    refused = next(text for text in outcomes if text != str(new.pk))
    assert "not the latest run of its workflow id" in refused
    assert run_of(old).reset_to["run_id"] == str(new.pk)
    assert Step.objects.filter(run=new).count() == new.reset_from["seq"]


@pytest.mark.parametrize("state", ["failed", "waiting"])
def test_a_reset_commits_everything_or_nothing(state: str) -> None:
    if state == "failed":
        old = failed_ten_steps("atomic")
    else:
        old = client.start("tests.r.branch", args=["atomic"], id="atomic")
        park(old.run_id)
    before, run_before = rows(), WorkflowRun.objects.filter(pk=old.run_id).values().get()
    faults.arm("before_reset_commit", "raise")
    with pytest.raises(faults.InjectedFault):
        old.reset(1, reason="fails at the last moment")
    assert rows() == before
    assert WorkflowRun.objects.filter(pk=old.run_id).values().get() == run_before


# -- what is refused, and nothing written ------------------------------------------------


def refused(
    handle: Any, to_seq: Any, match: str, error: type[Exception] = InvalidInput, **options: Any
) -> None:
    before = rows()
    run_before = WorkflowRun.objects.filter(pk=handle.run_id).values().get()
    options.setdefault("reason", "a test")
    with pytest.raises(error, match=match) as caught:
        handle.reset(to_seq, **options)
    assert rows() == before
    assert WorkflowRun.objects.filter(pk=handle.run_id).values().get() == run_before
    if error is InvalidInput and "reason" not in match and "args" not in match:
        assert getattr(caught.value, "field", None) == "to_seq"


def test_positions_out_of_range_are_refused() -> None:
    old = failed_ten_steps("range")  # positions 0 to 6
    refused(old, -1, "a position is 0 or more")
    refused(old, 8, r"past the end of the history \(positions 0 to 6\); to_seq may be at most 7")
    refused(old, True, "must be a position")
    refused(old, "3", "must be a position")
    refused(old, 3, "a reset needs a reason", reason="")
    refused(old, 3, "args must be a list", args={"key": "x"})
    refused(old, 3, "cannot be started with", WorkflowArgumentsError, kwargs={"nope": 1})


def test_a_cut_that_keeps_a_failed_step_would_fail_at_once_and_is_refused() -> None:
    old = failed_ten_steps("keeps-failure")
    refused(old, 7, "raises ActivityFailed.*would fail at once")


def test_a_cut_the_new_input_cannot_replay_is_refused() -> None:
    old = client.start("tests.r.branch", args=["branch"], id="branch")
    park(old.run_id)  # 0: record first, 1: record second, 2: sleeping
    refused(old, 2, "at position 0 the history records activity 'tests.record' but the workflow now asks "
            "for activity 'tests.noop'", args=["branch", "noop"])  # fmt: skip
    # An unfinished entry cannot be kept: the sleep would lose its completion.
    refused(old, 3, r"position 2 \(sleep\) is waiting, not finished.*Reset to position 2 or earlier")
    new = old.reset(2, args=["branch", "record"], reason="same path, input given again")
    assert run_of(new).args == ["branch", "record"]


def test_cuts_among_handler_applications_are_refused_and_an_update_before_the_cut_is_kept() -> None:
    old = client.start("tests.r.discount", args=["disc"], id="disc")
    park(old.run_id)  # 0: before, 1: waits for "go"
    with pytest.raises(UpdateTimeout):
        old.update("discount", 10, update_id="d1", wait=0)
    park(old.run_id)  # 2: update handler, 3: its audit step; still waiting at 1
    assert old.update_result("d1") == 10
    old.signal("go")
    assert drive(old.run_id) == "failed"  # 4: after, 5: step 6 fails
    history = [(entry["seq"], entry["kind"], entry["name"]) for entry in old.history()]
    assert history[1:4] == [
        (1, "signal", "go"),
        (2, "handler", "update:discount"),
        (3, "activity", "tests.m.audit"),
    ]

    refused(old, 2, "position 2 is a handler application .* recorded while the workflow was blocked")
    refused(old, 3, "falls inside the handler of update 'discount'")
    workflows.reset_bugs["step_6"] = False
    new = old.reset(5, reason="step 6 fixed")
    assert drive(new.run_id) == "completed"
    assert new.result() == {"discount": 10}
    assert (executions("disc:before"), executions("disc:audit"), executions("disc:after")) == (1, 1, 1)
    # The update applied before the cut is the new run's too, outcome and all.
    assert client.get_handle("disc").update_result("d1") == 10
    carried = Update.objects.get(run_id=new.run_id, update_id="d1")
    assert (carried.status, carried.applied_seq, carried.result) == ("completed", 2, 10)


def test_an_update_pending_on_the_old_run_is_applied_by_the_new_one() -> None:
    old = client.start("tests.r.discount", args=["pending"], id="pending")
    park(old.run_id)
    with pytest.raises(UpdateTimeout):
        old.update("discount", 7, update_id="d7", wait=0)
    new = old.reset(1, reason="before the wait")
    assert Update.objects.get(run_id=old.run_id, update_id="d7").error["type"] == "django_weft.Reset"
    park(new.run_id)  # waits at 1 again; applies the update meanwhile
    # Asked on the old run, the answer comes from the copy the new run applied.
    assert runtime.update_result(old.run_id, "d7", wait=5) == 7
    assert new.query("state") == {"discount": 7}


def test_an_update_applied_at_or_after_the_cut_is_applied_again_by_the_new_run() -> None:
    old = client.start("tests.r.discount", args=["again"], id="again")
    park(old.run_id)  # 0: before, 1: waits for "go"
    with pytest.raises(UpdateTimeout):
        old.update("discount", 5, update_id="d5", wait=0)
    park(old.run_id)  # 2: the update applied, 3: its audit step
    new = old.reset(1, reason="wait again")
    park(new.run_id)  # 1: waits again, and applies the update again meanwhile
    assert executions("again:audit") == 2
    applied = Update.objects.get(run_id=new.run_id, update_id="d5")
    assert (applied.status, applied.applied_seq, applied.result) == ("completed", 2, 5)
    # Its first outcome stays on the old run; the workflow id answers with the new one.
    first = Update.objects.get(run_id=old.run_id, update_id="d5")
    assert (first.status, first.applied_seq) == ("completed", 2)
    assert client.get_handle("again").update_result("d5") == 5
    assert new.query("state") == {"discount": 5}


def test_only_the_latest_run_of_a_workflow_id_can_be_reset() -> None:
    old = failed_ten_steps("latest")
    workflows.reset_bugs["step_6"] = False
    new = old.reset(5, reason="first")
    refused(old, 5, f"is not the latest run of its workflow id: run {new.run_id}", InvalidTransition)
    assert drive(new.run_id) == "completed"
    again = new.reset(10, reason="a completed run, replayed whole")
    assert drive(again.run_id) == "completed" and again.result() == sum(range(10))
    assert executions("latest:9") == 1


def test_a_failed_run_that_was_reset_cannot_be_retried() -> None:
    old = failed_ten_steps("no-retry")
    workflows.reset_bugs["step_6"] = False
    new = old.reset(5, reason="fixed")
    assert drive(new.run_id) == "completed"
    with pytest.raises(InvalidTransition, match=f"it was reset, and run {new.run_id} replaced it"):
        old.retry()
    assert run_of(old).status == "failed"


def test_a_run_past_its_execution_deadline_is_refused() -> None:
    old = client.start("tests.r.branch", args=["late"], id="late", execution_timeout=0.2)
    park(old.run_id)
    deadline = run_of(old).execution_deadline
    time.sleep(0.3)
    refused(old, 1, "passed its execution deadline", InvalidTransition)
    assert deadline is not None


def test_the_workflow_must_be_known_to_this_process() -> None:
    old = client.start("tests.r.branch", args=["unknown"], id="unknown")
    park(old.run_id)
    WorkflowRun.objects.filter(pk=old.run_id).update(workflow_name="tests.r.gone")
    refused(old, 1, "tests.r.gone", WorkflowNotRegistered)


# -- what the new run inherits -------------------------------------------------------------


def test_children_started_after_the_cut_are_closed_and_started_again() -> None:
    old = client.start("tests.r.parent", args=["kid"], id="kid")
    park(old.run_id)  # 0: record, 1: child started, waits for it
    first_child = WorkflowRun.objects.get(parent_id=old.run_id)
    park(str(first_child.pk))  # the child sleeps
    refused(old, 2, r"position 1 \(child tests.c.child\) is waiting, not finished")

    new = old.reset(1, reason="restart the child")

    first_child.refresh_from_db()
    assert first_child.status == "cancelled" and "was reset" in first_child.error["message"]
    park(new.run_id)
    second_child = WorkflowRun.objects.get(parent_id=new.run_id)
    assert second_child.workflow_id == first_child.workflow_id == "kid:1"
    assert executions("kid:parent") == 1


def test_a_reset_child_is_still_its_parents_child() -> None:
    parent = client.start("tests.c.parent", args=["adopt", 0.05], id="adopt")
    park(parent.run_id)
    child = WorkflowRun.objects.get(parent_id=parent.run_id)
    park(str(child.pk))  # 0: record, 1: sleeping
    new_child = client.get_handle(str(child.pk)).reset(1, reason="sleep again")
    assert run_of(parent).status == "waiting"  # not woken by its old child's close
    replacement = run_of(new_child)
    assert (replacement.parent_id, replacement.parent_seq, replacement.parent_close_policy) == (
        child.parent_id, child.parent_seq, child.parent_close_policy
    )  # fmt: skip
    # The sweep's backstop for parents left waiting does not take the reset child for a
    # finished one: one query finds no candidate, and no parent is locked.
    with CaptureQueriesContext(connection) as queries:
        assert runtime.get_store().sweep.wake_waiting_parents(100) == []
    assert len(queries) == 1
    assert drive(new_child.run_id) == "completed"
    assert drive(parent.run_id) == "completed"
    assert parent.result() == {"child": "child adopt done"}
    assert executions("adopt:child") == 1


def test_search_attributes_deadline_and_finalizer_state_carry_over() -> None:
    old = client.start("tests.r.attributes", args=["attrs"], id="attrs", execution_timeout=3600)
    park(old.run_id)  # 0: stage one, 1: record, 2: stage two, 3: waits
    new = old.reset(1, reason="attributes")
    new_run = run_of(new)
    assert new_run.search_attributes == run_of(old).search_attributes == {"stage": "two"}
    assert new_run.execution_deadline == run_of(old).execution_deadline
    assert Timer.objects.get(run=new_run, kind="deadline").fire_at == new_run.execution_deadline
    found = WorkflowRun.objects.search(stage="two").order_by("created_at").values_list("pk", flat=True)
    assert list(found) == [run_of(old).pk, new_run.pk]
    park(new.run_id)
    assert executions("attrs:one") == 2


def test_a_finalizer_state_kept_is_the_new_runs_and_the_closed_run_runs_no_finalizer() -> None:
    old = client.start("tests.f.booking", args=["fin"], id="fin")
    park(old.run_id)  # 0: state started, 1: book, 2: state booked, 3: waits for confirm
    new = old.reset(3, reason="wait again")
    assert run_of(old).finalizer is None
    assert run_of(new).finalizer_state == {"key": "fin", "stage": "booked"}
    assert not Timer.objects.filter(run_id=old.run_id).exists()


def test_the_old_runs_timers_go_and_the_new_run_arms_its_own() -> None:
    old = client.start("tests.r.branch", args=["timer"], id="timer")
    park(old.run_id)  # 2: sleeping an hour
    old_fire = Timer.objects.get(run_id=old.run_id, kind="sleep").fire_at
    time.sleep(0.05)
    new = old.reset(2, reason="sleep again from now")
    assert not Timer.objects.filter(run_id=old.run_id).exists()
    park(new.run_id)  # the sleep is not kept: it starts again
    new_fire = Timer.objects.get(run_id=new.run_id, kind="sleep").fire_at
    assert new_fire - old_fire >= timedelta(seconds=0.05)
    assert (executions("timer:first"), executions("timer:second")) == (1, 1)


def test_a_run_cancelled_by_a_request_can_be_reset_to_before_the_wait_it_received_it_at() -> None:
    old = client.start("tests.x.saga", args=["undo"], id="undo")
    park(old.run_id)  # 0: reserve, 1: sleeps an hour
    old.cancel(reason="by mistake", mode="request")
    assert drive(old.run_id) == "cancelled"  # 2: the request received, 3: release
    kinds = [entry["kind"] for entry in old.history()]
    assert kinds == ["activity", "sleep", "cancel_request", "activity"]
    refused(old, 2, "position 2 is a cancellation request received")
    refused(old, 3, r"position 1 \(sleep\) is waiting, not finished")

    new = old.reset(1, reason="the cancellation was a mistake")

    assert run_of(new).cancel_request is None  # received at 2: not kept
    park(new.run_id)  # sleeps an hour again
    assert (executions("undo:reserve"), executions("undo:release")) == (1, 1)
    assert run_of(old).status == "cancelled" and run_of(old).cancel_request["seq"] == 2
