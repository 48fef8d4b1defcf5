"""An inline activity's completed step is held back and written with the turn's next
write, or by the run's terminal commit when the workflow returns right after it: one
statement and one commit fewer per run, and no weaker record (docs/explanation/guarantees.md)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_weft import client
from django_weft.engine import faults
from django_weft.engine.executor import TurnOutcome
from django_weft.models import Step, WorkflowRun
from django_weft.testing import make_engine
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def steps_of(run_id: str) -> list[tuple[int, str, Any]]:
    return list(Step.objects.filter(run_id=run_id).order_by("seq").values_list("seq", "status", "result"))


class Crash(BaseException):
    """The process dies here."""


def crash_before_completion(run_id: str) -> None:
    """A turn of ``run_id`` whose process dies just before the run's terminal commit."""

    def crash(_context: dict[str, Any]) -> None:
        raise Crash

    faults.arm("before_complete", crash)
    try:
        with pytest.raises(Crash):
            make_engine().run_turn(run_id)
    finally:
        faults.disarm()


def test_each_activity_runs_after_the_step_before_it_is_recorded() -> None:
    handle = client.start("tests.ls.three_steps", args=["order"])
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    # What each attempt found recorded when it ran: every step before its own.
    assert handle.result() == [[], [0], [0, 1]]
    assert [(seq, status) for seq, status, _ in steps_of(handle.run_id)] == [
        (0, "completed"), (1, "completed"), (2, "completed"),
    ]  # fmt: skip


def test_the_last_step_is_recorded_by_the_completion(on_postgres: bool) -> None:
    handle = client.start("tests.ls.one_quiet_step", args=[{"n": 1}])
    with CaptureQueriesContext(connection) as turn:
        assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    assert steps_of(handle.run_id) == [(0, "completed", {"n": 1})]
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.status == "completed" and run.result == {"n": 1}
    step = Step.objects.get(run_id=handle.run_id)
    assert step.epoch == run.owner_epoch and step.finished_at is not None and step.attempt == 1
    if on_postgres:
        # The claim (with the history read) and the completion that records the step.
        statements = [query["sql"][:90] for query in turn.captured_queries]
        assert len(statements) == 2, statements


@pytest.mark.parametrize(
    ("workflow", "outcome", "status"),
    [
        ("tests.ls.step_then_raise", TurnOutcome.FAILED, "failed"),
        ("tests.ls.step_then_unencodable", TurnOutcome.FAILED, "failed"),
        ("tests.ls.step_then_sleep", TurnOutcome.PARKED, "waiting"),
    ],
)
def test_a_turn_that_ends_otherwise_records_the_held_step_first(
    workflow: str, outcome: TurnOutcome, status: str
) -> None:
    handle = client.start(workflow, args=["other"])
    assert make_engine().run_turn(handle.run_id) == outcome
    assert WorkflowRun.objects.get(pk=handle.run_id).status == status
    assert steps_of(handle.run_id)[0] == (0, "completed", [])


def test_a_deposed_completion_writes_neither_the_step_nor_the_end() -> None:
    handle = client.start("tests.ls.one_step", args=["deposed"])
    stale, fresh = make_engine("stale"), make_engine("fresh")

    def take_over(_context: dict[str, Any]) -> None:
        WorkflowRun.objects.filter(pk=handle.run_id).update(lease_expires_at="2000-01-01T00:00:00Z")
        assert fresh.store.claim(handle.run_id, "fresh", 30, 0) is not None

    faults.arm("before_complete", take_over)
    try:
        assert stale.run_turn(handle.run_id) == TurnOutcome.DEPOSED
    finally:
        faults.disarm()
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.status == "running" and run.owner_id == "fresh"
    assert steps_of(handle.run_id) == []  # the stale owner's step is not recorded
    assert SideEffect.objects.filter(key="deposed").count() == 1
    # The new owner runs the activity again (it was never recorded) and completes.
    WorkflowRun.objects.filter(pk=handle.run_id).update(owner_id=None, lease_expires_at=None)
    assert fresh.run_turn(handle.run_id) == TurnOutcome.COMPLETED
    assert SideEffect.objects.filter(key="deposed").count() == 2
    assert steps_of(handle.run_id) == [(0, "completed", [])]


def test_a_crash_before_the_completion_runs_the_last_activity_again() -> None:
    handle = client.start("tests.ls.one_step", args=["crash"])

    crash_before_completion(handle.run_id)
    assert steps_of(handle.run_id) == []  # held, not written: as a crash just after the attempt
    WorkflowRun.objects.filter(pk=handle.run_id).update(owner_id=None, lease_expires_at=None)
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    assert SideEffect.objects.filter(key="crash").count() == 2  # at least once, as documented
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "completed"


def woken(workflow: str, args: list[Any]) -> str:
    """A run of ``workflow`` parked on its sleep, and the sleep now over."""
    handle = client.start(workflow, args=args)
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    Step.objects.filter(run_id=handle.run_id, seq=0).update(result={"fire_at": "2000-01-01T00:00:00+00:00"})
    WorkflowRun.objects.filter(pk=handle.run_id).update(status="running", waiting_on=None)
    return handle.run_id


def test_the_end_of_a_sleep_is_recorded_by_the_next_write(on_postgres: bool) -> None:
    run_id = woken("tests.ls.nap", [3600])
    with CaptureQueriesContext(connection) as turn:
        assert make_engine().run_turn(run_id) == TurnOutcome.COMPLETED
    assert [(seq, status) for seq, status, _ in steps_of(run_id)] == [(0, "completed")]
    assert WorkflowRun.objects.get(pk=run_id).result == "rested"
    if on_postgres:
        # The claim, the history read and the completion that records the sleep's end.
        statements = [query["sql"][:90] for query in turn.captured_queries]
        assert len(statements) == 3, statements


def test_the_end_of_a_sleep_rides_past_an_activity_to_the_completion(on_postgres: bool) -> None:
    run_id = woken("tests.ls.nap_then_sleep_status", ["after-nap", 3600])
    with CaptureQueriesContext(connection) as turn:
        assert make_engine().run_turn(run_id) == TurnOutcome.COMPLETED
    # The attempt ran with the sleep's end not recorded yet (nothing depends on it) ...
    assert client.get_handle(run_id).result() == "waiting"
    # ... and the completion recorded both, the sleep's end first.
    assert [(seq, status) for seq, status, _ in steps_of(run_id)] == [(0, "completed"), (1, "completed")]
    if on_postgres:
        # The claim, the history read, the attempt's own read of the sleep, and the
        # completion with the sleep's end and the step.
        statements = [query["sql"][:90] for query in turn.captured_queries]
        assert len(statements) == 4, statements
        assert statements[2].startswith('SELECT "django_weft_step"."id"'), statements


def test_a_crash_before_the_completion_leaves_the_sleep_to_end_again_and_the_step_to_run_again() -> None:
    run_id = woken("tests.ls.nap_then_step", ["ridden", 3600])

    crash_before_completion(run_id)
    assert [(seq, status) for seq, status, _ in steps_of(run_id)] == [(0, "waiting")]  # both held
    WorkflowRun.objects.filter(pk=run_id).update(owner_id=None, lease_expires_at=None)
    assert make_engine().run_turn(run_id) == TurnOutcome.COMPLETED
    assert [(seq, status) for seq, status, _ in steps_of(run_id)] == [(0, "completed"), (1, "completed")]
    assert SideEffect.objects.filter(key="ridden").count() == 2  # at least once, as documented


def test_an_activity_result_after_the_sleep_is_recorded_before_the_next_activity() -> None:
    """The sleep's end rides on past the first activity; that activity's result does
    not: before the second activity runs, both are recorded."""
    run_id = woken("tests.ls.nap_then_two_steps", ["pair", 3600])
    assert make_engine().run_turn(run_id) == TurnOutcome.COMPLETED
    assert client.get_handle(run_id).result() == [[], [0, 1]]
    assert [(seq, status) for seq, status, _ in steps_of(run_id)] == [
        (0, "completed"), (1, "completed"), (2, "completed"),
    ]  # fmt: skip


def test_a_crash_before_the_sleeps_end_is_recorded_ends_it_again_on_replay() -> None:
    run_id = woken("tests.ls.nap", [3600])

    crash_before_completion(run_id)
    assert [(seq, status) for seq, status, _ in steps_of(run_id)] == [(0, "waiting")]  # held, not written
    WorkflowRun.objects.filter(pk=run_id).update(owner_id=None, lease_expires_at=None)
    assert make_engine().run_turn(run_id) == TurnOutcome.COMPLETED
    assert [(seq, status) for seq, status, _ in steps_of(run_id)] == [(0, "completed")]
