"""Schedules fired by real worker processes: three tickers at once fire each scheduled
time exactly once, and a ticker SIGKILLed after starting a fire's run but before moving
the schedule on leaves neither a duplicate nor a gap."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime

import pytest

from django_weft import client
from django_weft.models import Schedule, WorkflowRun

from .conftest import WorkerProcess, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def scheduled_times(schedule_id: str) -> Counter[datetime]:
    times = WorkflowRun.objects.filter(workflow_id__startswith=f"{schedule_id}-").values_list(
        "search_attributes", flat=True
    )
    return Counter(datetime.fromisoformat(attrs["weft_scheduled_at"]) for attrs in times)


def assert_no_duplicate_and_no_gap(schedule_id: str) -> Counter[datetime]:
    fired = scheduled_times(schedule_id)
    assert fired, "nothing fired"
    assert set(fired.values()) == {1}, {t: n for t, n in fired.items() if n > 1}
    first, last = min(fired), max(fired)
    expected = int((last - first).total_seconds()) + 1  # every second in between
    assert len(fired) == expected, sorted(
        set(range(expected)) - {int((t - first).total_seconds()) for t in fired}
    )
    return fired


@pytest.mark.postgres
def test_three_tickers_fire_each_second_exactly_once(start_worker: Callable[..., WorkerProcess]) -> None:
    client.create_schedule("every-second", "tests.echo", every="1s", overlap="allow_all", catchup_window="1h")
    workers = [start_worker(threads=2, tick=0.1) for _ in range(3)]
    started = time.monotonic()
    time.sleep(20)
    Schedule.objects.filter(pk="every-second").update(paused=True)
    for worker in workers:
        assert worker.process.poll() is None, worker.log
    fired = assert_no_duplicate_and_no_gap("every-second")
    assert len(fired) >= 16, f"{len(fired)} fires in {time.monotonic() - started:.0f} s"
    # All three took part (each logs the runs it started).
    starters = [w.log.count("schedule every-second: started run") for w in workers]
    assert sum(starters) == len(fired) and sum(1 for n in starters if n) >= 2, starters


def test_a_ticker_killed_between_start_and_advance_leaves_no_duplicate_and_no_gap(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    client.create_schedule("killed", "tests.echo", every="1s", overlap="allow_all", catchup_window="1h")
    # The first ticker dies holding its transaction: the run it started and the advance
    # roll back together.
    victim = start_worker(faults="schedule_before_advance:kill:3", threads=1, tick=0.1)
    assert victim.wait(30) == -9
    survivor = start_worker(threads=2, tick=0.1)
    wait_for(lambda: len(scheduled_times("killed")) >= 8, 30, "eight fires after the kill")
    Schedule.objects.filter(pk="killed").update(paused=True)
    assert survivor.process.poll() is None, survivor.log
    assert_no_duplicate_and_no_gap("killed")


def test_after_an_outage_fires_inside_the_window_start_and_older_ones_are_missed(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    handle = client.create_schedule(
        "outage", "tests.echo", every="1s", overlap="allow_all", catchup_window="3s"
    )
    first_due = Schedule.objects.get(pk="outage").next_fire_at
    time.sleep(10)  # no process ticks: about ten fires come due
    worker = start_worker(threads=2, tick=0.1)
    wait_for(lambda: Schedule.objects.get(pk="outage").missed_count, 30, "the missed fires to be counted")
    time.sleep(2)
    Schedule.objects.filter(pk="outage").update(paused=True)
    assert worker.process.poll() is None, worker.log
    schedule = Schedule.objects.get(pk="outage")
    fired = sorted(scheduled_times("outage"))
    missed_until = schedule.last_missed_at
    # Everything before the window was counted, not started; every second after it fired.
    assert schedule.missed_count >= 5
    assert fired[0] > missed_until and fired[0] >= first_due
    assert (fired[0] - missed_until).total_seconds() == 1  # no gap between missed and started
    (missed,) = [a for a in schedule.recent_actions if a["outcome"] == "missed"]
    first_tick = datetime.fromisoformat(missed["actual_at"])
    assert 0 <= (first_tick - fired[0]).total_seconds() <= 3  # started late, within the window
    assert_no_duplicate_and_no_gap("outage")
    assert handle.describe().missed == schedule.missed_count
