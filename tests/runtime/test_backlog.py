"""A backlog larger than one sweep's batch drains at the worker's pace, not a batch per
tick interval: ``weft_worker``'s sweep sweeps again as soon as its threads have room."""

from __future__ import annotations

import time
from typing import Any

import pytest

from django_weft import client
from django_weft.models import WorkflowRun
from django_weft.runtime.dispatch import SweepOnlyDispatcher, use_dispatcher
from django_weft.runtime.inprocess import InProcessWorker
from django_weft.runtime.sweep import TickReport

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
