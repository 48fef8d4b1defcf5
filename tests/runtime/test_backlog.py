"""A backlog larger than one sweep's batch drains at the worker's pace, not a batch per
tick interval: ``weft_worker``'s sweep sweeps again as soon as its threads have room."""

from __future__ import annotations

import time
from typing import Any

import pytest

from django_weft import client
from django_weft.models import WorkflowRun
from django_weft.runtime.dispatch import LocalDispatcher, SweepOnlyDispatcher, Work, use_dispatcher
from django_weft.runtime.inprocess import ROOM_FLOOR, ROOM_PER_THREAD, InProcessWorker
from django_weft.runtime.sweep import TickReport, tick

pytestmark = pytest.mark.django_db(transaction=True)


def completed_within(runs: list[str], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while WorkflowRun.objects.filter(pk__in=runs, status="completed").count() < len(runs):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_report_that_reached_its_batch_says_more_is_due() -> None:
    assert not TickReport(batch=5, fired=4, dispatched=4).backlog
    assert TickReport(batch=5, dispatched=5).backlog
    assert TickReport(batch=5, fired=5).backlog
    assert not TickReport(batch=0).backlog


def test_a_report_that_reached_its_dispatch_limit_says_more_is_due() -> None:
    assert TickReport(batch=100, dispatch_limit=4, dispatched=4).backlog
    assert not TickReport(batch=100, dispatch_limit=4, dispatched=3).backlog
    assert TickReport(batch=100, dispatch_limit=0, held_back=True).backlog


def test_a_local_dispatcher_counts_the_work_its_threads_took() -> None:
    local = LocalDispatcher()
    for index in range(3):
        local.dispatch_turn(f"run-{index}")
    assert local.taken_within(10) == 0
    assert local.get(0.1) == Work("run-0") and local.get(0.1) == Work("run-1")
    assert local.taken_within(10) == 2
    time.sleep(0.05)
    assert local.taken_within(0.01) == 0


def test_a_sweep_with_a_dispatch_limit_leaves_the_rest_runnable_for_another() -> None:
    """``weft_worker`` hands its threads only what they have room for: the other runs
    stay undispatched, and the next sweep (another worker's here) takes them."""
    runs = {client.start("tests.echo", args=[index]).run_id for index in range(7)}
    mine, theirs = LocalDispatcher(), LocalDispatcher()
    report = tick(mine, redispatch_after=60, dispatch_limit=3)
    assert (report.dispatched, report.backlog, mine.qsize()) == (3, True, 3)
    assert WorkflowRun.objects.filter(pk__in=runs, dispatched_at__isnull=True).count() == 4
    held = tick(mine, redispatch_after=60, dispatch_limit=0)
    assert (held.dispatched, held.held_back, held.backlog, mine.qsize()) == (0, True, True, 3)
    report = tick(theirs, redispatch_after=60)
    assert (report.dispatched, report.backlog) == (4, False)
    taken = [mine.get(0.1) for _ in range(3)]
    assert set(report.run_ids) | {work.run_id for work in taken if work is not None} == runs


def test_a_workers_room_is_its_threads_pace_less_its_queue() -> None:
    worker = InProcessWorker(threads=2)
    try:
        local = worker.dispatcher
        assert worker._room(0.5) == ROOM_FLOOR  # no pace yet: the floor
        for index in range(ROOM_FLOOR + 60):
            local.dispatch_turn(f"run-{index}")
        assert worker._room(0.5) == 0
        for _ in range(ROOM_FLOOR + 50):  # the threads took that many in the last half second
            local.get(0.1)
        assert worker._room(0.5) == ROOM_FLOOR + 50 - 10
        time.sleep(0.3)
        assert worker._room(0.2) == ROOM_FLOOR - 10  # the pace seen is over: the floor
        assert InProcessWorker(threads=ROOM_FLOOR)._room(0.5) == ROOM_FLOOR * ROOM_PER_THREAD
    finally:
        use_dispatcher(None)


def test_a_backlog_of_eight_batches_drains_within_one_tick_interval(settings: Any) -> None:
    # Only the sweep finds this work (no notices): a batch of 5 every 30 s would take
    # 4 minutes for 40 runs.
    settings.WEFT_TICK_BATCH = 5
    settings.WEFT_TICK_INTERVAL = 30
    settings.WEFT_NOTIFY = False
    runs = [client.start("tests.echo", args=[index]).run_id for index in range(40)]
    worker = InProcessWorker(threads=2)
    worker.start()
    try:
        assert completed_within(runs, 20)
    finally:
        worker.stop(timeout=10)


@pytest.mark.postgres
def test_runs_noticed_while_every_thread_was_busy_are_swept_once_there_is_room(settings: Any) -> None:
    """A worker whose threads all have work waiting leaves a work notice to its sweep
    (every worker gets every notice; each claiming every run would cost each run a claim
    per worker): its sweep runs as soon as the threads have room, not a tick later."""
    settings.WEFT_TICK_INTERVAL = 30
    worker = InProcessWorker(threads=1)
    worker.start()
    # This test's starts reach the worker by their notices alone, as another process's would.
    use_dispatcher(SweepOnlyDispatcher())
    try:
        time.sleep(0.5)  # the first sweep (nothing to do) and the listening connection
        busy = client.start("tests.slow_middle", args=["busy"], kwargs={"seconds": 1.0}).run_id
        time.sleep(0.2)
        quick = [client.start("tests.echo", args=[index]).run_id for index in range(5)]
        assert completed_within([busy, *quick], 10)
    finally:
        worker.stop(timeout=10)
