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
from .models import LedgerRow, PlannedOrder
from .workflows import (
    CHILD,
    LEDGER_AMOUNT,
    ORDER,
    SIGNAL,
    TICK,
    TICKED,
    expected_child_result,
    expected_order_result,
)

pytestmark = pytest.mark.django_db

KEY = "order-00001"
FIRST_FIRE = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


@dataclass
class State:
    order: WorkflowRun
    child: WorkflowRun
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
    """One order with two signals, its child and ledger row, and a schedule's three fires;
    the order was taken over once (epoch 1, then 2)."""
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
    schedule = Schedule.objects.create(
        id=SCHEDULE_ID, workflow_name=TICK, every_seconds=1, overlap="allow_all", fired_count=3
    )
    fires = []
    for i in range(3):
        fire = completed_run(TICK, workflow_id_for(SCHEDULE_ID, FIRST_FIRE + timedelta(seconds=i)), TICKED, 1)
        step(fire, 0, 1, "chaos.effect", args=["tick", 0])
        fires.append(fire)
    return State(order, child, fires, schedule)


def violations(report: Report, name: str) -> list[str]:
    return report.by_name(name).violations


def test_a_healthy_state_passes_every_invariant(state: State) -> None:
    report = check_all()
    assert report.ok, report.lines()
    counts = {i.name: i.checked for i in report.invariants if i.applicable}
    assert counts == {
        "runs_completed": 5,  # the order, its child, three fires
        "ledger_exactly_once": 1,
        "no_step_recorded_twice": 11,
        "no_write_after_deposition": 11,
        "signals_once_in_order": 2,
        "schedule_fires_once": 3,
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


def test_the_concurrency_hook_is_reported_as_not_applicable(state: State) -> None:
    hook = check_all().by_name("concurrency_limit_respected")
    assert not hook.applicable
    assert hook.line().startswith("concurrency_limit_respected: not applicable")
