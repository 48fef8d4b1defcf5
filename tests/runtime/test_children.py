"""Child workflows: the parent waits durably; parent-close policies; failures reach the parent."""

from __future__ import annotations

import time
from typing import Any

import pytest

from django_weft import WorkflowCancelled, client
from django_weft.engine.executor import TurnOutcome
from django_weft.models import Step, WorkflowRun
from django_weft.runtime import tick
from django_weft.runtime.dispatch import SweepOnlyDispatcher
from django_weft.testing import drive, make_engine
from tests.support.driver import Driver, park
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def child_of(parent_run_id: str) -> WorkflowRun:
    return WorkflowRun.objects.get(parent_id=parent_run_id)


def test_a_parent_waits_durably_for_a_child_that_sleeps(driver: Driver) -> None:
    handle = client.start("tests.c.parent", args=["p1"], kwargs={"seconds": 1.0})
    began = time.monotonic()
    assert handle.result(timeout=20) == {"child": "child p1 done"}
    assert time.monotonic() - began >= 1.0
    kid = child_of(handle.run_id)
    assert kid.status == "completed" and kid.workflow_id == f"{handle.workflow_id}:1"
    assert kid.parent_seq == 1 and kid.parent_close_policy == "terminate"
    step = Step.objects.get(run_id=handle.run_id, seq=1)
    assert (step.kind, step.name, step.status) == ("child", "tests.c.child", "completed")
    assert step.result["result"] == "child p1 done"
    for key in ("p1:parent-before", "p1:child", "p1:parent-after"):
        assert SideEffect.objects.filter(key=key).count() == 1, key


def test_the_parent_parks_and_the_childs_completion_wakes_it() -> None:
    handle = client.start("tests.c.parent", args=["p2"], kwargs={"seconds": 0.0})
    park(handle.run_id)  # started the child, parked waiting for it
    assert WorkflowRun.objects.get(pk=handle.run_id).waiting_on["kind"] == "activities"
    kid = child_of(handle.run_id)
    assert make_engine().run_turn(str(kid.pk)) == TurnOutcome.COMPLETED
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "running"  # woken
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    assert handle.result() == {"child": "child p2 done"}


def test_a_child_failure_is_a_catchable_error_in_the_parent() -> None:
    handle = client.start("tests.c.catches", args=["f"])
    park(handle.run_id)
    kid = child_of(handle.run_id)
    assert drive(str(kid.pk)) == "failed"
    assert drive(handle.run_id) == "completed"
    assert handle.result() == {"caught": "failed", "type": "ValueError", "message": "child f failed"}


def test_cancelling_a_child_directly_reaches_the_waiting_parent() -> None:
    handle = client.start("tests.c.parent", args=["cc"], kwargs={"seconds": 60})
    park(handle.run_id)
    kid = child_of(handle.run_id)
    park(str(kid.pk))
    client.get_handle(str(kid.pk)).cancel("not needed")
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "running"  # the cancel woke it
    assert drive(handle.run_id) == "failed"
    error = WorkflowRun.objects.get(pk=handle.run_id).error
    assert error["type"].endswith("ChildWorkflowFailed") and "cancelled" in error["message"]


@pytest.mark.parametrize(("policy", "child_status"), [("terminate", "cancelled"), ("abandon", "waiting")])
def test_cancelling_a_parent_applies_its_close_policy(policy: str, child_status: str) -> None:
    handle = client.start("tests.c.parent", args=[f"cp-{policy}"], kwargs={"seconds": 60, "policy": policy})
    park(handle.run_id)
    kid = child_of(handle.run_id)
    park(str(kid.pk))
    handle.cancel("parent cancelled")
    kid.refresh_from_db()
    assert kid.status == child_status
    if policy == "terminate":
        assert "parent run" in kid.error["message"]
        with pytest.raises(WorkflowCancelled):
            client.get_handle(str(kid.pk)).result(timeout=0)


def test_a_timed_out_parent_has_its_children_cancelled_by_the_sweep() -> None:
    handle = client.start("tests.c.parent", args=["to"], kwargs={"seconds": 60}, execution_timeout=0.3)
    park(handle.run_id)
    kid = child_of(handle.run_id)
    park(str(kid.pk))
    time.sleep(0.4)
    report = tick(SweepOnlyDispatcher())
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "timed_out"
    assert str(kid.pk) in report.closed_children
    kid.refresh_from_db()
    assert kid.status == "cancelled"


def test_children_fan_out_and_a_duplicate_child_id_is_refused(driver: Driver) -> None:
    handle = client.start("tests.c.fan_out", args=["fo", 4])
    began = time.monotonic()
    assert handle.result(timeout=20) == [f"child fo-{i} done" for i in range(4)]
    assert time.monotonic() - began < 2.0  # 4 x 0.2 s children ran side by side
    refused = client.start("tests.c.same_id", args=["dup"])
    assert refused.result(timeout=20) == "refused"
    assert WorkflowRun.objects.filter(workflow_id="dup-fixed").count() == 1


def test_a_child_that_continues_as_new_is_followed_to_its_last_run() -> None:
    from django_weft import workflow

    @workflow(name="tests.c.countdown_parent")
    def countdown_parent(ctx: Any) -> Any:
        return ctx.run_child("tests.countdown", 3)

    try:
        handle = client.start("tests.c.countdown_parent")
        park(handle.run_id)
        for _ in range(10):
            for run in WorkflowRun.objects.filter(parent_id=handle.run_id, status="running"):
                make_engine().run_turn(str(run.pk))
        assert WorkflowRun.objects.filter(parent_id=handle.run_id).count() >= 2
        assert drive(handle.run_id) == "completed"
        assert (
            handle.result()
            == WorkflowRun.objects.filter(parent_id=handle.run_id).order_by("-created_at").first().result
        )
    finally:
        from django_weft.engine.registry import registry

        registry.unregister("tests.c.countdown_parent")


def test_a_child_that_times_out_wakes_its_waiting_parent() -> None:
    handle = client.start("tests.c.parent", args=["cto"], kwargs={"seconds": 60})
    park(handle.run_id)
    kid = child_of(handle.run_id)
    park(str(kid.pk))
    WorkflowRun.objects.filter(pk=kid.pk).update(execution_deadline=kid.created_at)
    from django_weft.models import Timer

    Timer.objects.create(run_id=kid.pk, seq=-1, kind="deadline", fire_at=kid.created_at)
    tick(SweepOnlyDispatcher())
    kid.refresh_from_db()
    assert kid.status == "timed_out"
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "running"  # woken after the batch
    assert drive(handle.run_id) == "failed"
    assert "timed_out" in WorkflowRun.objects.get(pk=handle.run_id).error["message"]


def test_a_successor_created_by_a_slower_clock_is_still_the_childs_last_run() -> None:
    from datetime import timedelta

    from django_weft.store import DjangoStore

    handle = client.start("tests.c.countdown_parent_for_skew")
    park(handle.run_id)
    first = child_of(handle.run_id)
    assert make_engine().run_turn(str(first.pk)) == TurnOutcome.CONTINUED
    successor = WorkflowRun.objects.get(parent_id=handle.run_id, status="running")
    WorkflowRun.objects.filter(pk=successor.pk).update(created_at=first.created_at - timedelta(seconds=5))
    assert DjangoStore().turns.child_outcome(handle.run_id, 0) is None  # the successor is live
    assert drive(str(successor.pk)) == "completed"
    outcome = DjangoStore().turns.child_outcome(handle.run_id, 0)
    assert outcome is not None and outcome.run_id == str(successor.pk) and outcome.status == "completed"


def test_a_parent_that_continues_as_new_applies_its_close_policy() -> None:
    handle = client.start("tests.c.parent_continues", args=["pc"])
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.CONTINUED
    kid = WorkflowRun.objects.get(parent_id=handle.run_id)
    assert kid.status == "cancelled"


def test_retrying_a_parent_failed_by_its_child_starts_the_child_afresh() -> None:
    from tests.testapp import workflows

    handle = client.start("tests.c.retry_child", args=["rc"])
    park(handle.run_id)
    assert drive(str(child_of(handle.run_id).pk)) == "failed"
    assert drive(handle.run_id) == "failed"
    assert WorkflowRun.objects.get(pk=handle.run_id).error["seq"] == 0
    workflows.bugs["step_4"] = False
    try:
        handle.retry()
        park(handle.run_id)
        fresh = WorkflowRun.objects.get(parent_id=handle.run_id, status="running")
        assert drive(str(fresh.pk)) == "completed"
        assert drive(handle.run_id) == "completed"
    finally:
        workflows.bugs["step_4"] = True
    assert handle.result() == "child rc done"


def test_a_bad_child_id_fails_the_parent_with_a_clear_error() -> None:
    handle = client.start("tests.c.bad_id")
    assert drive(handle.run_id) == "failed"
    assert (
        "child workflow id must be a non-empty string"
        in WorkflowRun.objects.get(pk=handle.run_id).error["message"]
    )
