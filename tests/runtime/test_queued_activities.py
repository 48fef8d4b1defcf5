"""Queued activities and fan-out, driven in the test process (PostgreSQL and SQLite).

The activity attempts are run here with ``runtime.run_activity``, the function the
Celery task and ``weft_worker`` call; the process-level tests run them on real workers.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from django_weft import client, runtime
from django_weft.engine import faults
from django_weft.models import Step, Timer, WorkflowRun
from django_weft.runtime import ActivityOutcome, run_activity, tick
from django_weft.store import DjangoStore
from django_weft.testing import drive, make_engine, run_queued_activities
from tests.support.threads import in_threads
from tests.testapp.models import LedgerEntry, SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def executions(prefix: str) -> int:
    return SideEffect.objects.filter(key__startswith=prefix).count()


def step(run_id: str, seq: int) -> Step:
    return Step.objects.get(run_id=run_id, seq=seq)


def run_row(run_id: str) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=run_id)


def test_a_queued_activity_parks_the_run_until_a_worker_records_it() -> None:
    handle = client.start("tests.q.single", args=["single"])
    assert make_engine().run_turn(handle.run_id) == "parked"
    queued = step(handle.run_id, 1)
    assert (queued.status, queued.attempt, queued.name) == ("scheduled", 1, "tests.q.record")
    assert run_row(handle.run_id).waiting_on == {"kind": "activities", "mode": "all", "seqs": [1]}
    assert Timer.objects.filter(run_id=handle.run_id, kind="activity", seq=1, fired_at__isnull=True).exists()

    assert run_activity(handle.run_id, 1, 1) == ActivityOutcome.COMPLETED
    # The recording woke the run (it waited for exactly this) and removed the deadline timer.
    assert run_row(handle.run_id).status == "running"
    assert not Timer.objects.filter(run_id=handle.run_id, kind="activity").exists()
    assert drive(handle.run_id) == "completed"
    assert handle.result() == [1, 2, 3]
    assert executions("single:") == 3
    assert (
        list(Step.objects.filter(run_id=handle.run_id).values_list("status", flat=True)) == ["completed"] * 3
    )


def test_a_duplicate_delivery_of_an_attempt_runs_and_records_nothing() -> None:
    handle = client.start("tests.q.single", args=["dup"])
    make_engine().run_turn(handle.run_id)
    assert run_activity(handle.run_id, 1, 1) == ActivityOutcome.COMPLETED
    assert run_activity(handle.run_id, 1, 1) == ActivityOutcome.SKIPPED
    assert run_activity(handle.run_id, 1, 7) == ActivityOutcome.SKIPPED  # an attempt never scheduled
    assert executions("dup:queued") == 1


@pytest.mark.postgres
def test_concurrent_duplicate_deliveries_run_the_attempt_once() -> None:
    handles = [client.start("tests.q.single", args=[f"cdup{i}"]) for i in range(10)]
    for handle in handles:
        make_engine().run_turn(handle.run_id)
    barrier = threading.Barrier(4)

    def deliver(_: int) -> list[str]:
        delivered = []
        for handle in handles:
            barrier.wait()
            delivered.append(run_activity(handle.run_id, 1, 1))
        return delivered

    outcomes = [outcome for delivered in in_threads(deliver, 4, timeout=30) for outcome in delivered]
    assert outcomes.count(ActivityOutcome.COMPLETED) == 10
    assert outcomes.count(ActivityOutcome.SKIPPED) == 30
    for i in range(10):
        assert executions(f"cdup{i}:queued") == 1
    for handle in handles:
        assert drive(handle.run_id) == "completed"


def test_fan_out_waits_for_all_and_wakes_the_run_once() -> None:
    handle = client.start("tests.q.fan_out", args=["fan", 5])
    assert make_engine().run_turn(handle.run_id) == "parked"
    assert Step.objects.filter(run_id=handle.run_id, status="scheduled").count() == 5
    woken_after = []
    for seq in range(5):
        run_activity(handle.run_id, seq, 1)
        woken_after.append(run_row(handle.run_id).status)
    # Only the last recording wakes the run: the wait is for all of them.
    assert woken_after == ["waiting"] * 4 + ["running"]
    assert drive(handle.run_id) == "completed"
    assert handle.result() == [f"fan:{i}" for i in range(5)]


def test_wait_any_records_its_choice_and_replays_it() -> None:
    handle = client.start("tests.q.mixed", args=["mixed"])
    # The inline activity ran at start, so wait_any returns it without waiting.
    assert drive(handle.run_id) == "completed"
    assert handle.result() == {"first": "tests.record", "both": ["inline", "queued"]}
    choice = Step.objects.get(run_id=handle.run_id, kind="wait")
    assert choice.result == {"index": 1, "seq": 0}


def test_wait_any_parks_until_one_finishes_then_returns_that_one() -> None:
    handle = client.start("tests.q.race", args=["race"])
    make_engine().run_turn(handle.run_id)
    assert run_row(handle.run_id).waiting_on["mode"] == "any"
    assert run_activity(handle.run_id, 1, 1) == ActivityOutcome.COMPLETED  # the fast one
    assert run_row(handle.run_id).status == "running"
    make_engine().run_turn(handle.run_id)
    assert handle.result(timeout=5) == "race:fast"
    assert step(handle.run_id, 0).status == "scheduled"  # the slow one was never needed


def test_a_failed_attempt_is_retried_by_the_policy() -> None:
    handle = client.start("tests.q.flaky", args=["flaky", 2])
    assert drive(handle.run_id) == "completed"
    assert handle.result() == 3
    recorded = step(handle.run_id, 0)
    assert (recorded.status, recorded.attempt) == ("completed", 3)


def test_a_non_retryable_failure_fails_at_once_and_the_workflow_can_catch_it() -> None:
    handle = client.start("tests.q.broken", args=["broken"])
    assert drive(handle.run_id) == "completed"
    assert handle.result() == "caught ActivityFailed"
    recorded = step(handle.run_id, 0)
    assert (recorded.status, recorded.attempt, recorded.error["type"]) == ("failed", 1, "KeyError")
    assert "retryable" not in recorded.error
    assert executions("broken") == 1


def test_an_atomic_queued_activity_commits_with_its_record_and_rolls_back_a_failed_attempt() -> None:
    handle = client.start("tests.q.ledger", args=["ledger", True])
    assert drive(handle.run_id) == "completed"
    assert handle.result() == 5
    # Attempt 1 wrote its row and failed: the row went with it. Attempt 2's row stays.
    assert list(LedgerEntry.objects.values_list("key", "amount")) == [("ledger", 5)]
    assert step(handle.run_id, 0).attempt == 2


def test_a_lost_message_is_sent_again_after_its_deadline() -> None:
    handle = client.start("tests.q.single", args=["lostmsg"])
    make_engine().run_turn(handle.run_id)
    Timer.objects.filter(run_id=handle.run_id, kind="activity").update(fire_at="2000-01-01T00:00:00Z")
    tick()
    lost = step(handle.run_id, 1)
    assert (lost.status, lost.error["started"]) == ("lost", False)
    assert run_row(handle.run_id).status == "running"
    make_engine().run_turn(handle.run_id)
    again = step(handle.run_id, 1)
    # The same attempt, sent again (a resend is not a failure); the next deadline is longer.
    assert (again.status, again.attempt, again.result) == ("scheduled", 1, {"dispatches": 2})
    assert drive(handle.run_id) == "completed"
    assert executions("lostmsg:queued") == 1


def test_a_worker_lost_mid_attempt_leads_to_a_retry_and_its_late_result_is_discarded() -> None:
    handle = client.start("tests.q.flaky", args=["lostworker", 0])
    make_engine().run_turn(handle.run_id)
    store = DjangoStore()
    # A worker takes attempt 1 and dies without heartbeating: its lease is short.
    assert store.attempts.start_activity(handle.run_id, 0, 1, ttl=0.05) is not None
    time.sleep(0.1)
    tick()
    lost = step(handle.run_id, 0)
    assert (lost.status, lost.error["type"], lost.error["started"]) == (
        "lost",
        "django_weft.WorkerLost",
        True,
    )
    assert drive(handle.run_id) == "completed"
    assert step(handle.run_id, 0).attempt == 2
    # The dead worker's attempt cannot record anything now.
    assert store.attempts.finish_activity(handle.run_id, 0, 1, status="completed", result_json="99") == (
        False,
        False,
    )
    assert handle.result() == 1


def test_heartbeat_renews_the_lease_of_a_running_attempt() -> None:
    from django_weft.runtime.heartbeat import Heartbeat, running_attempt

    handle = client.start("tests.q.single", args=["renew"])
    make_engine().run_turn(handle.run_id)
    store = DjangoStore()
    store.attempts.start_activity(handle.run_id, 1, 1, ttl=1)
    before = Timer.objects.get(run_id=handle.run_id, kind="activity").fire_at
    with running_attempt(handle.run_id, 1, 1):
        Heartbeat(runtime.get_engine()).beat()
    assert Timer.objects.get(run_id=handle.run_id, kind="activity").fire_at > before


def test_an_attempt_finishing_while_its_run_is_driven_is_not_a_lost_wake_up() -> None:
    handle = client.start("tests.q.single", args=["race-park"])
    scheduled = threading.Event()
    proceed = threading.Event()

    def stall(context: dict[str, Any]) -> None:
        scheduled.set()
        assert proceed.wait(10)

    faults.arm("before_park", stall)
    outcome: list[str] = []

    def turn() -> None:
        from django.db import connections

        try:
            outcome.append(make_engine().run_turn(handle.run_id))
        finally:
            connections.close_all()

    thread = threading.Thread(target=turn)
    thread.start()
    assert scheduled.wait(10)
    # The run is owned by the stalled turn, so recording the activity cannot wake it...
    assert run_activity(handle.run_id, 1, 1) == ActivityOutcome.COMPLETED
    assert run_row(handle.run_id).status == "running"
    proceed.set()
    thread.join(10)
    # ...and the park sees the finished activity and leaves the run runnable instead.
    row = run_row(handle.run_id)
    assert (outcome, row.status, row.owner_id) == (["parked"], "running", None)
    assert drive(handle.run_id) == "completed"


def test_activities_of_a_finished_run_are_not_run() -> None:
    handle = client.start("tests.q.race", args=["finished"])
    make_engine().run_turn(handle.run_id)
    run_activity(handle.run_id, 1, 1)
    assert drive(handle.run_id) == "completed"
    assert run_activity(handle.run_id, 0, 1) == ActivityOutcome.SKIPPED
    assert run_queued_activities(handle.run_id) == 1  # still scheduled, and skipped again
    assert executions("finished:slow") == 0


def test_a_stale_attempts_heartbeat_does_not_extend_the_next_attempts_deadline() -> None:
    handle = client.start("tests.q.flaky", args=["staleheart", 0])
    engine = make_engine()
    engine.run_turn(handle.run_id)
    store = DjangoStore()
    store.attempts.start_activity(handle.run_id, 0, 1, ttl=0.05)
    time.sleep(0.1)
    tick()  # attempt 1 is lost
    engine.run_turn(handle.run_id)  # retrying, on a 0.05 s retry timer
    time.sleep(0.1)
    tick()
    engine.run_turn(handle.run_id)  # attempt 2 scheduled
    assert (step(handle.run_id, 0).status, step(handle.run_id, 0).attempt) == ("scheduled", 2)
    deadline = Timer.objects.get(run_id=handle.run_id, kind="activity").fire_at
    # The worker of attempt 1 was only stalled; its heartbeat comes back.
    store.attempts.renew_activities([(handle.run_id, 0, 1)], ttl=600)
    assert Timer.objects.get(run_id=handle.run_id, kind="activity").fire_at == deadline
    assert drive(handle.run_id) == "completed"


def test_a_failed_attempt_nobody_waits_for_yet_still_wakes_the_run_for_its_retry() -> None:
    handle = client.start("tests.q.background", args=["bg"])
    engine = make_engine()
    engine.run_turn(handle.run_id)
    assert run_row(handle.run_id).waiting_on["background"] == [0]  # parked on the sleep
    assert run_activity(handle.run_id, 0, 1) == ActivityOutcome.FAILED
    assert run_row(handle.run_id).status == "running"  # woken: the retry is decided now
    engine.run_turn(handle.run_id)
    assert step(handle.run_id, 0).status == "retrying"
    time.sleep(0.1)
    tick()  # the 0.05 s retry timer fires although the sleep has 30 s to go
    engine.run_turn(handle.run_id)
    assert (step(handle.run_id, 0).status, step(handle.run_id, 0).attempt) == ("scheduled", 2)
    assert run_activity(handle.run_id, 0, 2) == ActivityOutcome.COMPLETED
    assert run_row(handle.run_id).status == "waiting"  # a success it does not wait for: no wake
