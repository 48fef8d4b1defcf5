"""A tick's decisions for one schedule: catch-up window, missed fires, overlap policies."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from django_weft.engine.schedule_firing import (
    MAX_FIRES_PER_TICK,
    MAX_MISSED_PER_TICK,
    FireAction,
    OverlapPolicy,
    decide_overlap,
    due_fires,
    workflow_id_for,
)
from django_weft.engine.schedule_spec import ScheduleSpec


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def test_on_time_fire() -> None:
    spec = ScheduleSpec.build(every="1m")
    due = due_fires(spec, utc(2027, 1, 1, 10), utc(2027, 1, 1, 10, 0, 0, 300), catchup_window=60)
    assert due.start == [utc(2027, 1, 1, 10)]
    assert due.missed == 0 and due.next_fire_at == utc(2027, 1, 1, 10, 1)


@pytest.mark.parametrize("spec", [ScheduleSpec.build(every="1m"), ScheduleSpec.build(cron="* * * * *")])
def test_catch_up_window_starts_recent_fires_and_counts_older_ones(spec: ScheduleSpec) -> None:
    # Nothing ticked from 10:00 to 11:00:30; the window is 5 minutes.
    due = due_fires(spec, utc(2027, 1, 1, 10), utc(2027, 1, 1, 11, 0, 30), catchup_window=300)
    assert due.start == [utc(2027, 1, 1, 10, 56), utc(2027, 1, 1, 10, 57), utc(2027, 1, 1, 10, 58),
                         utc(2027, 1, 1, 10, 59), utc(2027, 1, 1, 11)]  # fmt: skip
    assert due.missed == 56  # 10:00 ... 10:55
    assert due.last_missed == utc(2027, 1, 1, 10, 55)
    assert due.next_fire_at == utc(2027, 1, 1, 11, 1)


def test_a_long_outage_at_every_second_is_counted_not_walked() -> None:
    spec = ScheduleSpec.build(every="1s")
    due = due_fires(spec, utc(2027, 1, 1), utc(2027, 1, 31), catchup_window=10)
    assert due.missed == 30 * 86400 - 10
    assert len(due.start) == 11  # the last 10 s and now itself
    assert due.next_fire_at == utc(2027, 1, 31, 0, 0, 1)


def test_end_at_stops_the_schedule() -> None:
    spec = ScheduleSpec.build(every="1h", end_at=utc(2027, 1, 1, 12))
    due = due_fires(spec, utc(2027, 1, 1, 11), utc(2027, 1, 1, 15), catchup_window=60)
    assert due.start == [] and due.missed == 2 and due.next_fire_at is None


def test_fires_per_tick_are_bounded() -> None:
    spec = ScheduleSpec.build(every="1s")
    now = utc(2027, 1, 1, 2)
    due = due_fires(spec, utc(2027, 1, 1), now, catchup_window=86400)
    assert len(due.start) == MAX_FIRES_PER_TICK
    assert due.next_fire_at == utc(2027, 1, 1) + timedelta(seconds=MAX_FIRES_PER_TICK)


def test_a_cron_far_behind_counts_its_missed_fires_over_several_ticks() -> None:
    # Every minute, in a zone with a DST change in the gap; 20 days down: 28,800 missed.
    spec = ScheduleSpec.build(cron="* * * * *", timezone="Europe/Rome")
    now, first = utc(2027, 4, 5, 12, 0, 30), utc(2027, 3, 16, 12)
    exact = sum(1 for _ in spec.between(first, now - timedelta(seconds=60)))
    ticks, total, moment = 0, 0, first
    while True:
        due = due_fires(spec, moment, now, catchup_window=60)
        ticks += 1
        total += due.missed
        assert due.missed <= MAX_MISSED_PER_TICK
        if due.start:
            assert not due.counting
            break
        assert due.counting
        assert due.next_fire_at is not None and due.next_fire_at < now  # still due: the next tick goes on
        moment = due.next_fire_at
    assert total == exact and ticks == -(-exact // MAX_MISSED_PER_TICK)
    assert due.start == [utc(2027, 4, 5, 12)]
    assert due.last_missed == utc(2027, 4, 5, 11, 59)


def test_an_end_inside_the_missed_range_stops_the_count_there() -> None:
    spec = ScheduleSpec.build(cron="* * * * * *", end_at=utc(2027, 1, 1, 2))  # every second, two hours
    moment, total = utc(2027, 1, 1), 0
    while True:
        due = due_fires(spec, moment, utc(2027, 1, 31), catchup_window=10)
        total += due.missed
        if not due.counting:
            break
        assert due.next_fire_at is not None
        moment = due.next_fire_at
    assert total == 2 * 3600 + 1 and due.last_missed == utc(2027, 1, 1, 2)
    assert due.start == [] and due.next_fire_at is None


@pytest.mark.parametrize(
    ("policy", "open_run", "buffered", "action"),
    [
        (OverlapPolicy.SKIP, False, 0, FireAction.START),
        (OverlapPolicy.SKIP, True, 0, FireAction.SKIP),
        (OverlapPolicy.BUFFER_ONE, True, 0, FireAction.BUFFER),
        (OverlapPolicy.BUFFER_ONE, True, 1, FireAction.SKIP),
        (OverlapPolicy.BUFFER_ALL, True, 3, FireAction.BUFFER),
        (OverlapPolicy.BUFFER_ALL, False, 2, FireAction.BUFFER),  # behind the buffered ones
        (OverlapPolicy.CANCEL_OTHER, True, 0, FireAction.CANCEL_OTHER_AND_WAIT),
        (OverlapPolicy.CANCEL_OTHER, True, 1, FireAction.SKIP),  # one fire waits already
        (OverlapPolicy.TERMINATE_OTHER, True, 0, FireAction.TERMINATE_OTHER_AND_START),
        (OverlapPolicy.TERMINATE_OTHER, False, 0, FireAction.START),
        (OverlapPolicy.ALLOW_ALL, True, 0, FireAction.START),
    ],
)
def test_overlap_decisions(policy: OverlapPolicy, open_run: bool, buffered: int, action: FireAction) -> None:
    assert decide_overlap(policy, open_run=open_run, buffered=buffered) == action


def test_workflow_id_is_the_utc_time_to_the_second() -> None:
    assert (
        workflow_id_for("nightly", datetime(2027, 3, 28, 3, 0, 0, 999, tzinfo=UTC))
        == "nightly-2027-03-28T03:00:00Z"
    )
