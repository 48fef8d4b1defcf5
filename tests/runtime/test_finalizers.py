"""Finalizers: at least once after a run ends cancelled or timed out, with recorded state."""

from __future__ import annotations

import time
from typing import Any

import pytest

from django_weft import client
from django_weft.engine.records import FINALIZER_SEQ
from django_weft.models import Timer, WorkflowRun
from django_weft.runtime import ActivityOutcome, run_finalizer, tick
from django_weft.runtime.dispatch import LocalDispatcher, SweepOnlyDispatcher
from django_weft.testing import drive
from tests.support.driver import park
from tests.testapp import workflows
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def finalizer_of(run_id: str) -> dict:
    return WorkflowRun.objects.get(pk=run_id).finalizer


def cleanups(key: str) -> int:
    return SideEffect.objects.filter(key=f"{key}:cleanup").count()


def test_a_cancelled_run_runs_its_finalizer_once_with_the_recorded_state() -> None:
    handle = client.start("tests.f.booking", args=["b1"])
    park(handle.run_id)
    assert WorkflowRun.objects.get(pk=handle.run_id).finalizer_state == {"key": "b1", "stage": "booked"}
    handle.cancel("customer left")
    assert finalizer_of(handle.run_id) == {"activity": "tests.f.cleanup", "status": "pending", "attempt": 0}
    assert Timer.objects.filter(run_id=handle.run_id, seq=FINALIZER_SEQ, kind="finalizer").exists()
    assert drive(handle.run_id) == "cancelled"
    finalizer = finalizer_of(handle.run_id)
    assert finalizer["status"] == "completed" and finalizer["attempt"] == 1
    assert finalizer["result"] == "cleaned booked"
    assert cleanups("b1") == 1
    assert not Timer.objects.filter(run_id=handle.run_id).exists()
    # A duplicate delivery of the attempt does nothing.
    assert run_finalizer(handle.run_id, 1) == ActivityOutcome.SKIPPED
    assert cleanups("b1") == 1


def test_a_completed_run_does_not_run_its_finalizer() -> None:
    handle = client.start("tests.f.booking", args=["b2"])
    park(handle.run_id)
    handle.signal("confirm")
    assert drive(handle.run_id) == "completed"
    assert finalizer_of(handle.run_id) is None and cleanups("b2") == 0


def test_a_timed_out_run_runs_its_finalizer() -> None:
    handle = client.start("tests.f.booking", args=["b3"], execution_timeout=0.2)
    park(handle.run_id)
    time.sleep(0.3)
    tick(SweepOnlyDispatcher())
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "timed_out"
    assert finalizer_of(handle.run_id)["status"] == "pending"
    assert drive(handle.run_id) == "timed_out"
    assert finalizer_of(handle.run_id)["status"] == "completed" and cleanups("b3") == 1


def test_a_failing_finalizer_is_retried_and_its_outcome_is_visible() -> None:
    workflows.finalizer_failures.update({"b4": 2, "b5": 5})
    try:
        retried = client.start("tests.f.booking", args=["b4"])
        park(retried.run_id)
        retried.cancel()
        drive(retried.run_id)
        finalizer = finalizer_of(retried.run_id)
        assert finalizer["status"] == "completed" and finalizer["attempt"] == 3
        assert cleanups("b4") == 3

        broken = client.start("tests.f.booking", args=["b5"])
        park(broken.run_id)
        broken.cancel()
        drive(broken.run_id)
        finalizer = finalizer_of(broken.run_id)
        assert finalizer["status"] == "failed" and finalizer["attempt"] == 3
        assert finalizer["error"]["message"] == "cleanup of b5 failed"
        assert not Timer.objects.filter(run_id=broken.run_id).exists()
    finally:
        workflows.finalizer_failures.clear()


def test_the_sweep_sends_a_lost_finalizer_attempt_again(settings) -> None:  # type: ignore[no-untyped-def]

    handle = client.start("tests.f.booking", args=["b6"])
    park(handle.run_id)
    handle.cancel()
    local = LocalDispatcher()
    assert tick(local).finalizers == 1  # attempt 1 sent
    work = local.get(1)
    assert work is not None and (work.seq, work.attempt) == (FINALIZER_SEQ, 1)
    # The worker takes attempt 1 and dies before recording it: its lease runs out.
    from django_weft.store import DjangoStore

    assert DjangoStore().finalizers.start_finalizer(handle.run_id, 1, lease=0.1) is not None
    time.sleep(0.2)
    assert tick(local).finalizers == 1
    work = local.get(1)
    assert work is not None and work.attempt == 2
    assert finalizer_of(handle.run_id)["error"]["type"] == "django_weft.WorkerLost"
    assert run_finalizer(handle.run_id, 2) == ActivityOutcome.COMPLETED
    assert finalizer_of(handle.run_id)["status"] == "completed"


def test_lost_finalizer_attempts_count_towards_its_retry_policy() -> None:
    from django_weft.store import DjangoStore

    handle = client.start("tests.f.booking", args=["b7"])
    park(handle.run_id)
    handle.cancel()
    store = DjangoStore()
    for attempt in (1, 2, 3):  # every attempt's worker dies: max_attempts is 3
        assert store.finalizers.start_finalizer(handle.run_id, attempt, lease=0.05) is not None
        time.sleep(0.1)
        due = store.finalizers.claim_due_finalizers(10, 0.0)
        assert due == ([(handle.run_id, attempt + 1)] if attempt < 3 else [])
    finalizer = finalizer_of(handle.run_id)
    assert finalizer["status"] == "failed" and finalizer["error"]["type"] == "django_weft.WorkerLost"
    assert not Timer.objects.filter(run_id=handle.run_id).exists()


def test_a_worker_sweep_sends_only_finalizers_of_its_own_workflows() -> None:
    # A weft_worker lacking a workflow's code would find no finalizer for it and drop it:
    # its sweep leaves the finalizer to a worker that has the workflow.
    handle = client.start("tests.f.booking", args=["b8"])
    park(handle.run_id)
    handle.cancel()
    local = LocalDispatcher()
    assert tick(local, workflows={"tests.echo"}).finalizers == 0
    assert local.get(0.1) is None
    assert finalizer_of(handle.run_id)["status"] == "pending"
    assert tick(local, workflows={"tests.f.booking"}).finalizers == 1
    work = local.get(1)
    assert work is not None and (work.seq, work.attempt) == (FINALIZER_SEQ, 1)


def test_a_worker_without_the_workflow_leaves_its_finalizer_for_one_with_it(monkeypatch: Any) -> None:
    from django_weft.engine.registry import registry

    handle = client.start("tests.f.booking", args=["b9"])
    park(handle.run_id)
    handle.cancel()
    assert tick(LocalDispatcher()).finalizers == 1  # beat's sweep sends attempt 1 to anyone
    with monkeypatch.context() as patched:  # a worker deployed without this workflow
        patched.delitem(registry.workflows, "tests.f.booking")
        assert run_finalizer(handle.run_id, 1) == ActivityOutcome.SKIPPED
    assert finalizer_of(handle.run_id)["status"] == "pending"  # not started, not dropped
    assert run_finalizer(handle.run_id, 1) == ActivityOutcome.COMPLETED
    assert cleanups("b9") == 1
