"""The invariant checker can fail: a healthy state passes, and each invariant reports a
state built to break it. No processes: the rows are written directly."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from django_weft.engine.schedule_firing import workflow_id_for
from django_weft.models import Schedule, Signal, Step, WorkflowRun

from .invariants import SCHEDULE_ID, Report, check_all
from .models import LedgerRow, PlannedOrder, SlotMark
from .workflows import (
    CHILD,
    ENTER,
    LEAVE,
    LEDGER_AMOUNT,
    LIMITED,
    ORDER,
    SIGNAL,
    TICK,
    TICKED,
    expected_child_result,
    expected_limited_result,
    expected_order_result,
    lane_for,
    limited_id,
)

pytestmark = pytest.mark.django_db

KEY = "order-00001"
FIRST_FIRE = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


@dataclass
class State:
    order: WorkflowRun
    child: WorkflowRun
    limited: WorkflowRun
    fires: list[WorkflowRun]
    schedule: Schedule


def step(
    run: WorkflowRun, seq: int, epoch: int, name: str = "", kind: str = "activity", **fields: object
) -> Step:
    return Step.objects.create(
        run=run, seq=seq, kind=kind, name=name or kind, status="completed", epoch=epoch,
        started_at=timezone.now(), **fields,
    )  # fmt: skip


def completed_run(name: str, workflow_id: str, result: object, epoch: int, **fields: object) -> WorkflowRun:
    return WorkflowRun.objects.create(
        workflow_name=name, workflow_id=workflow_id, status="completed", result=result, owner_epoch=epoch,
        **fields,
    )  # fmt: skip


@pytest.fixture
def state() -> State:
    """One order with two signals, its child, ledger row and limited run (which marked its
    entry and exit), and a schedule's three fires; the order was taken over once (epoch
    1, then 2)."""
    PlannedOrder.objects.create(key=KEY, signals=2)
    order = completed_run(ORDER, KEY, expected_order_result(KEY, 2), 2, args=[KEY, 2])
    step(order, 0, 1, "chaos.effect", args=[f"{KEY}:inline", 1])
    step(order, 1, 1, "chaos.queued_effect", args=[f"{KEY}:queued", 2])
    step(order, 2, 1, "chaos.ledger", args=[KEY, LEDGER_AMOUNT])
    step(order, 3, 2, kind="sleep")
    step(order, 4, 2, SIGNAL, kind="signal")
    step(order, 5, 2, SIGNAL, kind="signal")
    step(order, 6, 2, CHILD, kind="child")
    Signal.objects.create(run=order, name=SIGNAL, payload=0, signal_id=f"{KEY}:0", consumed_seq=4)
    Signal.objects.create(run=order, name=SIGNAL, payload=1, signal_id=f"{KEY}:1", consumed_seq=5)
    LedgerRow.objects.create(key=KEY, run_id=order.pk, amount=LEDGER_AMOUNT)
    child = completed_run(CHILD, f"{KEY}:6", expected_child_result(KEY), 1, args=[KEY], parent=order)
    step(child, 0, 1, "chaos.effect", args=[f"{KEY}:child", 0])
    lane = lane_for(KEY)
    limited = completed_run(LIMITED, limited_id(KEY), expected_limited_result(KEY, lane), 1, args=[KEY, lane])
    mark(limited, ENTER, 1)
    mark(limited, LEAVE, 3)
    schedule = Schedule.objects.create(
        id=SCHEDULE_ID, workflow_name=TICK, every_seconds=1, overlap="allow_all", fired_count=3
    )
    fires = []
    for i in range(3):
        fire = completed_run(TICK, workflow_id_for(SCHEDULE_ID, FIRST_FIRE + timedelta(seconds=i)), TICKED, 1)
        step(fire, 0, 1, "chaos.effect", args=["tick", 0])
        fires.append(fire)
    return State(order, child, limited, fires, schedule)


def mark(run: WorkflowRun, edge: str, second: float, lane: str = "") -> None:
    """A slot mark of ``run``, ``second`` seconds after the state's first moment."""
    SlotMark.objects.create(
        run_id=run.pk, key=run.args[0], lane=lane or run.args[1], edge=edge,
        at=FIRST_FIRE + timedelta(seconds=second),
    )  # fmt: skip


def limited_run(
    n: int,
    enter: float | None,
    leave: float | None,
    *,
    created: float = 0,
    lane: str = "lane-0",
    **fields: object,
) -> WorkflowRun:
    """Another run of the limited workflow in ``lane``, created ``created`` seconds after the
    state's first moment, with the marks given (seconds after it too)."""
    key = f"order-9{n:04d}"
    fields.setdefault("status", "completed")
    run = WorkflowRun.objects.create(
        workflow_name=LIMITED, workflow_id=limited_id(key), args=[key, lane], **fields
    )
    WorkflowRun.objects.filter(pk=run.pk).update(created_at=FIRST_FIRE + timedelta(seconds=created))
    if enter is not None:
        mark(run, ENTER, enter)
    if leave is not None:
        mark(run, LEAVE, leave)
    return run


def violations(report: Report, name: str) -> list[str]:
    return report.by_name(name).violations


def test_a_healthy_state_passes_every_invariant(state: State) -> None:
    report = check_all()
    assert report.ok, report.lines()
    counts = {i.name: i.checked for i in report.invariants if i.applicable}
    assert counts == {
        "runs_completed": 6,  # the order, its child, its limited run, three fires
        "ledger_exactly_once": 1,
        "no_step_recorded_twice": 11,
        "no_write_after_deposition": 11,
        "signals_once_in_order": 2,
        "schedule_fires_once": 3,
        "concurrency_limit_respected": 1,
    }
    assert report.figures["multi_epoch_runs"] == 1


# -- runs_completed ---------------------------------------------------------------------------


def test_a_run_that_did_not_complete_is_reported(state: State) -> None:
    WorkflowRun.objects.filter(pk=state.order.pk).update(status="failed")
    assert violations(check_all(), "runs_completed") == [f"order {KEY}: failed (run {state.order.pk})"]


def test_a_wrong_result_is_reported(state: State) -> None:
    WorkflowRun.objects.filter(pk=state.child.pk).update(result="something else")
    assert "child of order-00001: result 'something else'" in violations(check_all(), "runs_completed")[0]


def test_a_planned_order_without_a_run_is_reported(state: State) -> None:
    PlannedOrder.objects.create(key="order-00002", signals=0)
    found = violations(check_all(), "runs_completed")
    assert "order order-00002: 0 runs instead of 1" in found


def test_a_run_nobody_planned_and_a_second_child_are_reported(state: State) -> None:
    completed_run(ORDER, "order-99999", None, 1)
    completed_run(CHILD, f"{KEY}:7", expected_child_result(KEY), 1, args=[KEY], parent=state.order)
    found = violations(check_all(), "runs_completed")
    assert "order order-99999: a run nobody planned" in found
    assert f"order {KEY}: 2 child runs instead of 1" in found


# -- ledger_exactly_once ----------------------------------------------------------------------


def test_a_second_ledger_row_is_reported(state: State) -> None:
    LedgerRow.objects.create(key=KEY, run_id=state.order.pk, amount=LEDGER_AMOUNT)
    assert violations(check_all(), "ledger_exactly_once") == [f"order {KEY}: 2 ledger rows instead of 1"]


def test_a_missing_ledger_row_and_a_stray_one_are_reported(state: State) -> None:
    LedgerRow.objects.filter(key=KEY).update(key="order-elsewhere")
    found = violations(check_all(), "ledger_exactly_once")
    assert found == [
        f"order {KEY}: 0 ledger rows instead of 1",
        "ledger key order-elsewhere: 1 rows of no planned order",
    ]


def test_a_ledger_row_without_its_completed_step_is_reported(state: State) -> None:
    Step.objects.filter(run=state.order, name="chaos.ledger").update(status="failed")
    found = violations(check_all(), "ledger_exactly_once")
    assert found == [f"order {KEY}: the ledger step is recorded completed 0 times"]


# -- no_step_recorded_twice -------------------------------------------------------------------


def test_an_activity_call_recorded_at_two_positions_is_reported(state: State) -> None:
    # (Two steps at one position cannot be written at all: weft_step_unique_seq refuses them.)
    step(state.order, 7, 2, "chaos.ledger", args=[KEY, LEDGER_AMOUNT])
    found = violations(check_all(), "no_step_recorded_twice")
    assert found == [f'run {state.order.pk}: chaos.ledger["{KEY}", {LEDGER_AMOUNT}] recorded at 2 positions']


# -- no_write_after_deposition ----------------------------------------------------------------


def test_a_step_written_by_a_deposed_epoch_is_reported(state: State) -> None:
    # Epoch 2 took the run over and wrote steps 3-6; epoch 1 woke up and wrote step 7.
    step(state.order, 7, 1, "chaos.effect", args=["zombie", 0])
    found = violations(check_all(), "no_write_after_deposition")
    late = "step 7 was written by epoch 1 after step 6 of epoch 2 (a write after a deposition)"
    assert found == [f"run {state.order.pk}: {late}"]


def test_a_step_of_an_epoch_the_run_never_reached_and_one_of_no_owner_are_reported(state: State) -> None:
    Step.objects.filter(run=state.child, seq=0).update(epoch=5)
    Step.objects.filter(run=state.fires[0], seq=0).update(epoch=0)
    found = violations(check_all(), "no_write_after_deposition")
    assert f"run {state.child.pk}: step 0 names epoch 5, the run only reached 1" in found
    assert f"run {state.fires[0].pk}: step 0 was written by no owner (epoch 0)" in found


# -- signals_once_in_order --------------------------------------------------------------------


def test_a_signal_stored_twice_is_reported(state: State) -> None:
    Signal.objects.create(run=state.order, name=SIGNAL, payload=1, signal_id=f"{KEY}:1-again", consumed_seq=7)
    assert violations(check_all(), "signals_once_in_order") == [
        f"order {KEY}: signals stored as [0, 1, 1], sent [0, 1]"
    ]


def test_signals_consumed_out_of_order_are_reported(state: State) -> None:
    Signal.objects.filter(run=state.order, payload=0).update(consumed_seq=5)
    Signal.objects.filter(run=state.order, payload=1).update(consumed_seq=4)
    assert violations(check_all(), "signals_once_in_order") == [
        f"order {KEY}: signals consumed at positions [5, 4], not in arrival order"
    ]


def test_a_signal_never_consumed_is_reported(state: State) -> None:
    Signal.objects.filter(run=state.order, payload=1).update(consumed_seq=None)
    assert violations(check_all(), "signals_once_in_order") == [f"order {KEY}: signal 1 was never consumed"]


# -- schedule_fires_once ----------------------------------------------------------------------


def test_a_scheduled_second_without_a_run_is_reported(state: State) -> None:
    state.fires[1].delete()
    Schedule.objects.filter(pk=SCHEDULE_ID).update(fired_count=2)
    assert violations(check_all(), "schedule_fires_once") == [
        "1 scheduled second(s) without a run, the first at 12:00:01"
    ]


def test_a_fire_that_started_two_runs_is_reported(state: State) -> None:
    completed_run(TICK, state.fires[2].workflow_id, TICKED, 1)
    found = violations(check_all(), "schedule_fires_once")
    assert found == [
        "the fire at 12:00:02 started 2 runs",
        "the schedule counts 3 fires, 4 runs exist",
    ]


def test_skipped_and_missed_fires_are_reported(state: State) -> None:
    Schedule.objects.filter(pk=SCHEDULE_ID).update(skipped_count=1, missed_count=2)
    assert violations(check_all(), "schedule_fires_once") == ["the schedule skipped 1 and missed 2 fires"]


def test_a_limited_run_that_did_not_complete_or_is_missing_is_reported(state: State) -> None:
    WorkflowRun.objects.filter(pk=state.limited.pk).update(status="cancelled")
    PlannedOrder.objects.create(key="order-00002", signals=0)
    found = violations(check_all(), "runs_completed")
    assert f"limited run of {KEY}: cancelled (run {state.limited.pk})" in found
    assert "order order-00002: 0 limited runs instead of 1" in found


# -- concurrency_limit_respected ------------------------------------------------------------


def test_runs_up_to_the_limit_at_once_pass_and_one_more_is_reported(state: State) -> None:
    # The state's run holds lane-0 from second 1 to 3; with a second run from 2 to 4 the
    # lane is full (a third that enters as one leaves does not overlap it).
    second = limited_run(1, 2, 4)
    limited_run(2, 3, 5, created=2.5)  # started with the lane full: it waited
    report = check_all()
    assert not violations(report, "concurrency_limit_respected")
    line = report.by_name("concurrency_limit_respected").line()
    assert line.endswith("(3 checked; at most 2 of 2 at once; 1 runs started with their lane full)"), line
    third = limited_run(3, 2.5, 2.8)
    found = violations(check_all(), "concurrency_limit_respected")
    assert found == [
        f"lane-0: 3 runs held a slot at 12:00:02.500000 (limit 2): "
        f"{', '.join(sorted(str(run.pk) for run in (state.limited, second, third)))}"
    ]


def test_runs_of_other_lanes_do_not_count_against_a_lane(state: State) -> None:
    limited_run(1, 2, 4)
    limited_run(2, 2, 4, lane="lane-1")
    limited_run(3, 2, 4, lane="lane-1")
    assert not violations(check_all(), "concurrency_limit_respected")


def test_a_run_that_entered_and_never_left_holds_its_slot_until_it_finished(state: State) -> None:
    # It entered at 2 s and failed at 10 s: with another from 4 to 5 s, the lane is full.
    limited_run(1, 2, None, status="failed", finished_at=FIRST_FIRE + timedelta(seconds=10))
    limited_run(2, 4, 5)
    assert not violations(check_all(), "concurrency_limit_respected")
    limited_run(3, 6, 7)
    limited_run(4, 6.5, 8)
    found = violations(check_all(), "concurrency_limit_respected")
    assert len(found) == 1 and found[0].startswith("lane-0: 3 runs held a slot at 12:00:06.500000"), found


def test_a_run_still_holding_its_slot_counts_without_end(state: State) -> None:
    limited_run(1, 2, None, status="waiting")
    limited_run(2, 100, 101)
    limited_run(3, 100.5, 102)
    assert violations(check_all(), "concurrency_limit_respected")[0].startswith("lane-0: 3 runs held a slot")


def test_marks_written_twice_missing_or_of_no_run_are_reported(state: State) -> None:
    mark(state.limited, ENTER, 1.5)
    unmarked = limited_run(1, None, None)
    SlotMark.objects.create(run_id=state.order.pk, key=KEY, lane="lane-0", edge=ENTER, at=FIRST_FIRE)
    found = violations(check_all(), "concurrency_limit_respected")
    assert sorted(found) == sorted([
        f"run {state.limited.pk}: marked its entry 2 and its exit 1 times",
        f"run {unmarked.pk}: completed without marking its entry and its exit",
        f"run {state.order.pk}: slot marks of no run of {LIMITED}",
    ])  # fmt: skip
