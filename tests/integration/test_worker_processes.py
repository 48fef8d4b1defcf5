"""Crash, restart and shutdown behaviour with real ``weft_worker`` processes."""

from __future__ import annotations

import signal
import time
from datetime import datetime

import pytest
from django.test import override_settings

from django_weft import UpdateTimeout, client
from django_weft.models import Step, Update, WorkflowRun
from tests.testapp.models import LedgerEntry, SideEffect

from .conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def count(key: str) -> int:
    return SideEffect.objects.filter(key=key).count()


def status(run_id: str) -> str:
    return WorkflowRun.objects.get(pk=run_id).status


def test_sigkill_mid_run_resumes_without_re_executing_committed_steps(start_worker) -> None:  # type: ignore[no-untyped-def]
    handle = client.start("tests.ten_steps", args=["cr"])
    # The 5th step commit kills the process: steps 0-3 are recorded, step 4's activity
    # has run but its result is not.
    first = start_worker(faults="before_step_commit:kill:5")
    assert first.wait(30) == -signal.SIGKILL
    assert Step.objects.filter(run_id=handle.run_id).count() == 4
    assert count("cr:4") == 1
    assert WorkflowRun.objects.get(pk=handle.run_id).owner_id is not None  # the dead owner's lease

    second = start_worker()
    assert handle.result(timeout=30) == {"total": 45}
    assert "objects loaded at start" in second.log  # frozen out of the collector's walks
    assert list(Step.objects.filter(run_id=handle.run_id).values_list("seq", flat=True)) == list(range(10))
    for i in range(10):
        expected = 2 if i == 4 else 1  # only the in-flight step ran again
        assert count(f"cr:{i}") == expected, (i, count(f"cr:{i}"))
    assert WorkflowRun.objects.get(pk=handle.run_id).owner_epoch == 2


def test_atomic_activity_killed_before_commit_leaves_no_row_then_commits_once(start_worker) -> None:  # type: ignore[no-untyped-def]
    handle = client.start("tests.atomic_ledger", args=["at"])
    first = start_worker(faults="atomic_before_commit:kill")
    assert first.wait(30) == -signal.SIGKILL
    assert LedgerEntry.objects.count() == 0
    assert count("at:ledger") == 0
    assert count("at:before") == 1

    start_worker()
    assert handle.result(timeout=30) == 42
    assert LedgerEntry.objects.filter(key="at").count() == 1
    assert count("at:ledger") == 1
    step = Step.objects.get(run_id=handle.run_id, seq=1)
    assert step.name == "tests.ledger_write" and step.result == 42


def test_durable_sleep_survives_a_worker_restart(start_worker) -> None:  # type: ignore[no-untyped-def]
    tick = 1.0
    first = start_worker(tick=tick)
    handle = client.start("tests.sleepy", kwargs={"seconds": 2.0})
    wait_for(lambda: status(handle.run_id) == "waiting", 15, "the run to park on its sleep")
    first.signal(signal.SIGKILL)
    first.wait(10)
    start_worker(tick=tick)
    woke = datetime.fromisoformat(handle.result(timeout=30))
    fire_at = datetime.fromisoformat(Step.objects.get(run_id=handle.run_id, kind="sleep").result["fire_at"])
    lag = (woke - fire_at).total_seconds()
    assert 0 <= lag <= tick + 0.5, lag
    assert count("sleepy:before") == 1 and count("sleepy:after") == 1


def test_sigterm_lets_the_running_turn_finish(start_worker) -> None:  # type: ignore[no-untyped-def]
    worker = start_worker()
    handle = client.start("tests.slow_middle", args=["st"], kwargs={"seconds": 1.5})
    wait_for(lambda: count("st:slow") == 1, 15, "the slow activity to start")
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    assert status(handle.run_id) == "completed"
    assert count("st:slow") == 1
    log = worker.log
    assert "claimed, epoch 1" in log and "completed" in log and "weft worker stopped" in log


def test_sigterm_releases_a_turn_that_outlasts_the_shutdown_timeout(start_worker) -> None:  # type: ignore[no-untyped-def]
    worker = start_worker(args=("--shutdown-timeout", "0.3"))
    handle = client.start("tests.slow_middle", args=["rl"], kwargs={"seconds": 3})
    wait_for(lambda: count("rl:slow") == 1, 15, "the slow activity to start")
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.status == "running" and run.owner_id is None  # released, runnable
    assert "released at shutdown" in worker.log
    start_worker()  # no lease to wait for: the next worker claims it at once
    assert handle.result(timeout=30) == "done"
    assert count("rl:slow") == 2 and count("rl:before") == 1


@pytest.mark.parametrize("point", ["before_update_apply", "before_update_answer"])
def test_an_update_is_applied_exactly_once_after_its_worker_was_killed(start_worker, point: str) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL after the update was accepted: before its application was recorded, or
    after its handler ran (its activity committed) but before its outcome was recorded."""
    handle = client.start("tests.m.cart", args=["uk"])
    first = start_worker(faults=f"{point}:kill")
    wait_for(lambda: status(handle.run_id) == "waiting", 15, "the run to block")
    with pytest.raises(UpdateTimeout) as caught:
        handle.update("address", {"city": "Oslo"}, wait=0)
    assert first.wait(30) == -signal.SIGKILL
    update = Update.objects.get(update_id=caught.value.update_id)
    assert update.status == "accepted"
    assert (update.applied_seq is None) == (point == "before_update_apply")
    assert count("uk:address") == (1 if point == "before_update_answer" else 0)

    start_worker()
    result = handle.update_result(caught.value.update_id, wait=30)
    assert result == {"address": {"city": "Oslo"}, "items": 0}
    assert count("uk:address") == 1  # the handler's activity ran once in all
    markers = Step.objects.filter(run_id=handle.run_id, kind="handler", name="update:address")
    assert markers.count() == 1 and markers.get().status == "completed"
    assert handle.update("close", wait=30) == "closed"
    assert handle.result(timeout=30)["address"] == {"city": "Oslo"}


def test_wait_signal_times_out_across_a_worker_restart(start_worker) -> None:  # type: ignore[no-untyped-def]
    first = start_worker(tick=0.5)
    handle = client.start("tests.m.wait_with_timeout", args=[2.0])
    wait_for(lambda: status(handle.run_id) == "waiting", 15, "the run to wait for its signal")
    first.signal(signal.SIGKILL)
    first.wait(10)
    start_worker(tick=0.5)
    began = time.monotonic()
    assert handle.result(timeout=30) == "timed out"
    step = Step.objects.get(run_id=handle.run_id, kind="signal")
    fire_at = datetime.fromisoformat(step.result["fire_at"])
    assert step.result["timed_out"] is True
    assert step.finished_at >= fire_at
    assert time.monotonic() - began < 10


def test_a_finalizer_runs_again_after_its_worker_was_killed_during_it(start_worker) -> None:  # type: ignore[no-untyped-def]
    handle = client.start("tests.f.booking", args=["fk"])
    first = start_worker(faults="before_finalizer_finish:kill")
    wait_for(lambda: status(handle.run_id) == "waiting", 15, "the run to block")
    handle.cancel("gone")
    assert first.wait(30) == -signal.SIGKILL  # ran the finalizer, killed before recording it
    assert count("fk:cleanup") == 1
    assert WorkflowRun.objects.get(pk=handle.run_id).finalizer["status"] == "running"

    start_worker()
    finalizer = wait_for(
        lambda: (f := WorkflowRun.objects.get(pk=handle.run_id).finalizer)["status"] == "completed" and f,
        30,
        "the finalizer to complete on the second worker",
    )
    assert finalizer["attempt"] == 2 and finalizer["result"] == "cleaned booked"
    assert count("fk:cleanup") == 2  # at least once: it ran again after the kill


def test_weft_worker_takes_a_run_sent_to_a_queue_nobody_consumes_within_a_tick(start_worker) -> None:  # type: ignore[no-untyped-def]
    """With the Celery contrib app installed and only weft_worker running, a start marks
    its run dispatched (to Celery); the worker's sweep takes it at its next tick, not
    after WEFT_REDISPATCH_AFTER (15 s by default)."""
    worker = start_worker(tick=1.0, env_vars={"WEFT_TEST_REDISPATCH_AFTER": "15"})
    wait_for(lambda: "weft worker" in worker.log and "started" in worker.log, 30, "the worker to start")
    time.sleep(1.5)  # past the worker's first tick
    with override_settings(WEFT_DISPATCHER="tests.dispatchers.UnconsumedQueueDispatcher"):
        started = time.monotonic()
        handle = client.start("tests.echo", args=["hi"])
        assert WorkflowRun.objects.get(pk=handle.run_id).dispatched_at is not None
        assert handle.result(timeout=10) == {"args": ["hi"], "kwargs": {}}
    assert time.monotonic() - started < 2.0, time.monotonic() - started
