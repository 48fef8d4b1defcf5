"""An inline activity's completed step is held back and written with the turn's next
write, or by the run's terminal commit when the workflow returns right after it: one
statement and one commit fewer per run, and no weaker record (docs/explanation/guarantees.md)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_weft import client, runtime
from django_weft.engine import faults
from django_weft.engine.errors import InvalidInput
from django_weft.engine.executor import TurnOutcome
from django_weft.engine.fencing import MAX_HELD
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


def test_a_query_and_a_reset_go_past_a_sleep_whose_time_has_come_though_its_end_is_not_recorded() -> None:
    """A turn stopped between a due sleep and the write that records its end (here: just
    before the completion) leaves the sleep recorded as waiting on a time that has
    passed. It is over all the same: a query replays past it, and a reset may keep it."""
    run_id = woken("tests.ls.nap_phase", ["phase", 3600])
    crash_before_completion(run_id)
    assert [(seq, status) for seq, status, _ in steps_of(run_id)] == [(0, "waiting")]
    handle = client.get_handle(run_id)
    assert handle.query("phase") == "awake"
    handle.cancel("stopped with its sleep's end unrecorded")
    reset = runtime.reset(run_id, 1, reason="keep the sleep, run the step again")
    assert make_engine().run_turn(reset.run_id) == TurnOutcome.COMPLETED
    assert client.get_handle(reset.run_id).result() == "phase"
    assert [(seq, status) for seq, status, _ in steps_of(reset.run_id)] == [
        (0, "completed"),
        (1, "completed"),
    ]


def test_a_cut_after_a_sleep_still_ahead_is_refused() -> None:
    handle = client.start("tests.ls.nap_phase", args=["ahead", 3600])
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    handle.cancel("stopped asleep")
    with pytest.raises(InvalidInput, match="position 0 \\(sleep\\) is waiting, not finished"):
        runtime.reset(handle.run_id, 1, reason="skip the sleep")


def test_sleeps_ending_in_a_row_are_held_a_few_at_a_time(on_postgres: bool) -> None:
    handle = client.start("tests.ls.many_naps", args=[MAX_HELD * 2 + 3])
    with CaptureQueriesContext(connection) as turn:
        assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    assert [status for _, status, _ in steps_of(handle.run_id)] == ["completed"] * (MAX_HELD * 2 + 3)
    if on_postgres:
        # The claim; two groups of MAX_HELD written step by step; the completion with the rest.
        finish = [query["sql"] for query in turn.captured_queries if query["sql"].startswith("WITH done AS")]
        assert len(finish) == 1 and finish[0].count("INSERT INTO django_weft_step") == 3
        assert len(turn.captured_queries) == 1 + 2 * MAX_HELD + 1
