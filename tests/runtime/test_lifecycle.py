"""Cancel, suspend, resume, execution timeout and retry: external transitions rotate the epoch."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction

from django_weft import (
    UpdateFailed,
    UpdateTimeout,
    WorkflowCancelled,
    WorkflowTerminalError,
    WorkflowTimedOut,
    client,
    signals,
)
from django_weft.engine.errors import InvalidTransition
from django_weft.engine.executor import TurnOutcome
from django_weft.models import Step, Timer, Update, WorkflowRun
from django_weft.testing import drive, make_engine
from tests.support.driver import Driver, park
from tests.testapp import workflows
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def count(key: str) -> int:
    return SideEffect.objects.filter(key=key).count()


def run_of(handle: Any) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=handle.run_id)


# -- cancel ----------------------------------------------------------------------------


def cancel_in_another_process(run_id: str, reason: str) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONPATH=str(repo),
        WEFT_TEST_DB="postgres",
        WEFT_TEST_PG_NAME=str(connection.settings_dict["NAME"]),
    )
    done = subprocess.run(
        [sys.executable, "-m", "django", "weft_cancel", run_id, "--reason", reason],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "now cancelled" in done.stdout


@pytest.mark.postgres
def test_cancel_while_an_engine_runs_an_activity_deposes_it() -> None:
    # The activity outlasts the cancel command's process (Django's start-up takes ~2 s
    # alone, more on a busy machine).
    handle = client.start("tests.slow_middle", args=["cx"], kwargs={"seconds": 8.0})
    other = client.start("tests.ten_steps", args=["other"])
    engine_a = make_engine("engine-A")
    outcomes: list[TurnOutcome] = []

    def drive_a() -> None:
        try:
            outcomes.append(engine_a.run_turn(handle.run_id))
            outcomes.append(engine_a.run_turn(other.run_id))  # A goes on with other runs
        finally:
            connection.close()

    thread = threading.Thread(target=drive_a)
    thread.start()
    deadline = time.monotonic() + 10
    while count("cx:slow") == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    before = run_of(handle)
    assert before.owner_id == "engine-A"
    # Another process cancels it: an operator's command on the same database.
    cancel_in_another_process(handle.run_id, "changed my mind")
    after = run_of(handle)  # durable at once, while A is still inside the activity
    assert after.status == "cancelled" and after.owner_id is None
    assert after.owner_epoch == before.owner_epoch + 1
    assert after.failure_category == "cancellation"
    thread.join(20)
    assert outcomes == [TurnOutcome.DEPOSED, TurnOutcome.COMPLETED]
    # A's write after the activity was rejected: the slow step and what follows are absent.
    assert list(Step.objects.filter(run_id=handle.run_id).values_list("seq", flat=True)) == [0]
    assert not Step.objects.filter(run_id=handle.run_id, created_at__gt=after.finished_at).exists()
    assert count("cx:after") == 0
    with pytest.raises(WorkflowCancelled) as caught:
        handle.result(timeout=1)
    assert caught.value.reason == "changed my mind"
    assert other.result(timeout=1) == {"total": 45}


def test_cancel_removes_timers_fails_pending_updates_and_refuses_finished_runs() -> None:
    handle = client.start("tests.m.cart", args=["c"])
    park(handle.run_id)
    handle.signal("add", "x")  # wakes it; stays buffered
    with pytest.raises(UpdateTimeout) as pending:
        handle.update("close", wait=0)
    waiting = client.start("tests.sleepy", kwargs={"seconds": 60})
    park(waiting.run_id)
    assert Timer.objects.filter(run_id=waiting.run_id).unfired().exists()

    handle.cancel()
    waiting.cancel()
    assert not Timer.objects.filter(run_id=waiting.run_id).unfired().exists()
    with pytest.raises(UpdateFailed, match="cancelled"):
        handle.update_result(pending.value.update_id)
    with pytest.raises(WorkflowTerminalError, match="cancelled"):
        handle.cancel()
    with pytest.raises(WorkflowTerminalError):
        handle.signal("add", "y")
    # A worker holding a stale doorbell for it does nothing.
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.NOT_CLAIMED
    done = client.start("tests.echo")
    assert drive(done.run_id) == "completed"
    with pytest.raises(WorkflowTerminalError, match="completed"):
        done.cancel()


def test_a_suspended_run_can_be_cancelled() -> None:
    handle = client.start("tests.sleepy", kwargs={"seconds": 60})
    park(handle.run_id)
    handle.suspend()
    assert handle.cancel() == "cancelled"
    with pytest.raises(WorkflowCancelled):
        handle.result(timeout=0)


# -- suspend and resume ----------------------------------------------------------------


def test_suspend_while_sleeping_then_resume_after_the_fire_time_does_not_sleep_again() -> None:
    from django_weft.runtime import tick
    from django_weft.runtime.dispatch import SweepOnlyDispatcher

    handle = client.start("tests.sleepy", kwargs={"seconds": 0.3})
    park(handle.run_id)
    epoch = run_of(handle).owner_epoch
    assert handle.suspend() == "suspended"
    run = run_of(handle)
    assert run.status == "suspended" and run.owner_epoch == epoch + 1
    time.sleep(0.5)  # the sleep's fire time passes while suspended
    tick(SweepOnlyDispatcher())  # the sweep collects the timer and does not wake the run
    assert run_of(handle).status == "suspended"
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.NOT_CLAIMED
    began = time.monotonic()
    assert handle.resume() == "running"
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    assert time.monotonic() - began < 0.3
    assert Step.objects.filter(run_id=handle.run_id, kind="sleep").count() == 1
    assert count("sleepy:before") == 1 and count("sleepy:after") == 1


def test_resume_re_arms_the_wait_with_its_original_fire_time() -> None:
    handle = client.start("tests.sleepy", kwargs={"seconds": 30})
    park(handle.run_id)
    fire_at = Timer.objects.get(run_id=handle.run_id, kind="sleep").fire_at
    handle.suspend()
    handle.resume()
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    timer = Timer.objects.get(run_id=handle.run_id, kind="sleep")
    assert timer.fire_at == fire_at and timer.fired_at is None


def test_signals_and_updates_sent_while_suspended_are_delivered_after_resume() -> None:
    handle = client.start("tests.m.cart", args=["s"])
    park(handle.run_id)
    handle.suspend()
    handle.signal("add", "while suspended")
    with pytest.raises(UpdateTimeout) as caught:
        handle.update("close", wait=0)
    assert run_of(handle).status == "suspended"  # kept, not woken
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.NOT_CLAIMED
    handle.resume()
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    assert handle.update_result(caught.value.update_id) == "closed"
    assert handle.result()["items"] == ["while suspended"]


def test_resume_and_suspend_refuse_runs_in_other_states() -> None:
    handle = client.start("tests.sleepy", kwargs={"seconds": 60})
    with pytest.raises(InvalidTransition, match="only a suspended run can be resumed"):
        handle.resume()
    park(handle.run_id)
    handle.suspend()
    with pytest.raises(InvalidTransition, match="is suspended"):
        handle.suspend()
    handle.cancel()
    with pytest.raises(WorkflowTerminalError):
        handle.suspend()
    with pytest.raises(WorkflowTerminalError):
        handle.resume()


# -- wakes that reach an engine that does not own the run ------------------------------


def test_a_discarded_wake_keeps_the_timer_of_a_waiting_run() -> None:
    handle = client.start("tests.sleepy", kwargs={"seconds": 60})
    park(handle.run_id)
    # The timer's doorbell reaches another engine early (or twice): nothing to claim.
    assert make_engine("stray").run_turn(handle.run_id) == TurnOutcome.NOT_CLAIMED
    assert Timer.objects.filter(run_id=handle.run_id, kind="sleep").unfired().count() == 1


def test_a_discarded_wake_collects_the_timers_of_a_finished_run() -> None:
    handle = client.start("tests.echo")
    assert drive(handle.run_id) == "completed"
    # An orphan: a timer left behind for a finished run.
    Timer.objects.create(run_id=handle.run_id, seq=3, kind="sleep", fire_at=run_of(handle).finished_at)
    assert make_engine("stray").run_turn(handle.run_id) == TurnOutcome.NOT_CLAIMED
    assert not Timer.objects.filter(run_id=handle.run_id).exists()


def test_a_discarded_wake_of_a_suspended_run_keeps_its_deadline() -> None:
    handle = client.start("tests.sleepy", kwargs={"seconds": 60}, execution_timeout=600)
    park(handle.run_id)
    handle.suspend()
    assert make_engine("stray").run_turn(handle.run_id) == TurnOutcome.NOT_CLAIMED
    kinds = set(Timer.objects.filter(run_id=handle.run_id).unfired().values_list("kind", flat=True))
    assert kinds == {"deadline"}  # the sleep's timer was collected; resume re-arms it
    handle.resume()
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    kinds = set(Timer.objects.filter(run_id=handle.run_id).unfired().values_list("kind", flat=True))
    assert kinds == {"deadline", "sleep"}


# -- execution timeout -----------------------------------------------------------------


def test_an_execution_timeout_times_out_a_waiting_run(settings: Any, driver: Driver) -> None:
    handle = client.start("tests.m.wait_with_timeout", args=[600], execution_timeout=2)
    deadline = run_of(handle).execution_deadline
    with pytest.raises(WorkflowTimedOut):
        handle.result(timeout=10)
    run = run_of(handle)
    assert run.status == "timed_out" and run.failure_category == "timeout"
    lag = (run.finished_at - deadline).total_seconds()
    assert 0 <= lag <= settings.WEFT_TICK_INTERVAL + 1, lag
    assert not Timer.objects.filter(run_id=handle.run_id).unfired().exists()
    with pytest.raises(WorkflowTerminalError, match="timed_out"):
        handle.signal("go", "too late")


def test_a_run_that_finishes_in_time_leaves_no_deadline_behind() -> None:
    handle = client.start("tests.echo", execution_timeout="1h")
    assert Timer.objects.filter(run_id=handle.run_id, kind="deadline").exists()
    assert drive(handle.run_id) == "completed"
    assert not Timer.objects.filter(run_id=handle.run_id).exists()


# -- retry -----------------------------------------------------------------------------


def test_retry_after_a_fix_resumes_at_the_failed_step() -> None:
    handle = client.start("tests.l.eight_steps", args=["rt"])
    try:
        assert drive(handle.run_id) == "failed"
        run = run_of(handle)
        assert run.error["seq"] == 4 and run.error["message"] == "a bug in step 4"
        workflows.bugs["step_4"] = False  # the fix is deployed
        assert handle.retry() == "running"
        run = run_of(handle)
        assert run.status == "running" and run.attempt == 2 and run.error is None
        assert drive(handle.run_id) == "completed"
    finally:
        workflows.bugs["step_4"] = True
    assert handle.result() == sum(range(8))
    assert [count(f"rt:{i}") for i in range(8)] == [1, 1, 1, 1, 2, 1, 1, 1]
    with pytest.raises(InvalidTransition, match="only a failed run can be retried"):
        handle.retry()


def test_retry_after_a_non_determinism_error_once_the_code_is_fixed() -> None:
    handle = client.start("tests.l.changing", args=["nd"])
    park(handle.run_id)
    workflows.bugs["v2"] = True  # a deploy reorders the workflow under the running run
    try:
        assert drive(handle.run_id) == "failed"
    finally:
        workflows.bugs["v2"] = False  # ...and is rolled back
    assert run_of(handle).failure_category == "nondeterminism"
    handle.retry()
    assert drive(handle.run_id) == "completed"
    assert count("nd:first") == 1 and count("nd:second") == 1


def test_retry_is_refused_while_another_run_has_the_workflow_id() -> None:
    handle = client.start("tests.l.eight_steps", args=["dup"], id="order-7")
    assert drive(handle.run_id) == "failed"
    client.start("tests.echo", id="order-7", on_conflict="start_new_if_terminal")
    with pytest.raises(InvalidTransition, match="another run with workflow id 'order-7'"):
        handle.retry()
    assert run_of(handle).status == "failed"


# -- Django signals --------------------------------------------------------------------


def test_django_signals_are_sent_after_commit() -> None:
    received: list[tuple[str, str]] = []
    ends: dict[str, Any] = {}

    def receiver_for(name: str) -> Any:
        def receiver(sender: Any, run_id: str, workflow_name: str, **kwargs: Any) -> None:
            assert sender is WorkflowRun
            received.append((name, workflow_name))
            if "finished_at" in kwargs:
                ends[run_id] = (name, kwargs["finished_at"])

        return receiver

    names = ["run_started", "run_completed", "run_failed", "run_cancelled", "run_suspended",
             "run_resumed", "run_timed_out"]  # fmt: skip
    receivers = {name: receiver_for(name) for name in names}
    for name, receiver in receivers.items():
        getattr(signals, name).connect(receiver)
    try:
        done = client.start("tests.echo")
        drive(done.run_id)
        failed = client.start("tests.l.eight_steps", args=["sig"])
        drive(failed.run_id)
        paused = client.start("tests.sleepy", kwargs={"seconds": 60})
        park(paused.run_id)
        paused.suspend()
        paused.resume()
        paused.cancel()
        with pytest.raises(RuntimeError), transaction.atomic():
            client.start("tests.echo", id="rolled-back")
            raise RuntimeError("roll back")
        assert ("run_started", "tests.echo") in received
        assert received.count(("run_started", "tests.echo")) == 1  # not the rolled-back one
        for expected in [
            ("run_completed", "tests.echo"),
            ("run_failed", "tests.l.eight_steps"),
            ("run_suspended", "tests.sleepy"),
            ("run_resumed", "tests.sleepy"),
            ("run_cancelled", "tests.sleepy"),
        ]:
            assert expected in received, expected
        # The signals that end a run carry its end as stored; no other signal has one.
        assert {name for name, _ in ends.values()} == {"run_completed", "run_failed", "run_cancelled"}
        for handle in (done, failed, paused):
            assert ends[handle.run_id][1] == WorkflowRun.objects.get(pk=handle.run_id).finished_at
    finally:
        for name, receiver in receivers.items():
            getattr(signals, name).disconnect(receiver)


# -- external transitions racing the owner ---------------------------------------------


@pytest.mark.postgres
def test_random_cancel_suspend_resume_racing_two_workers_leave_every_run_consistent() -> None:
    runs = [client.start("tests.l.churn", args=[f"r{i}"]).run_id for i in range(200)]
    last: dict[str, str] = {}
    succeeded: Counter[str] = Counter()
    stop = threading.Event()
    errors: list[BaseException] = []

    def chaos() -> None:
        rng = random.Random(7)
        try:
            while not stop.is_set():
                run_id = rng.choice(runs)
                if rng.random() < 0.5:
                    # Half the time, a run that a worker is driving right now.
                    owned = list(
                        WorkflowRun.objects.filter(owner_id__isnull=False).values_list("pk", flat=True)
                    )
                    if owned:
                        run_id = str(rng.choice(owned))
                command = rng.choice(["cancel", "suspend", "resume", "resume"])
                if command == "resume" and rng.random() < 0.5:
                    # Half the resumes go to a suspended run (a random one rarely is).
                    suspended = list(
                        WorkflowRun.objects.filter(status="suspended").values_list("pk", flat=True)
                    )
                    if suspended:
                        run_id = str(rng.choice(suspended))
                handle = client.get_handle(run_id)
                try:
                    getattr(handle, command)()
                except (InvalidTransition, WorkflowTerminalError):
                    continue  # refused: the run's state did not change
                last[run_id] = command
                succeeded[command] += 1
                time.sleep(rng.random() * 0.005)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    workers = [Driver("worker-1"), Driver("worker-2")]
    chaos_thread = threading.Thread(target=chaos)
    chaos_thread.start()
    time.sleep(4)
    # On a slow machine, go on until each command has changed a run at least once.
    busy_until = time.monotonic() + 20
    while set(succeeded) < {"cancel", "suspend", "resume"} and time.monotonic() < busy_until:
        time.sleep(0.1)
    stop.set()
    chaos_thread.join(30)
    assert not errors, errors
    deadline = time.monotonic() + 60
    while WorkflowRun.objects.filter(status__in=["running", "waiting", "pending"]).exists():
        assert time.monotonic() < deadline, "runs are stuck"
        time.sleep(0.1)
    for worker in workers:
        worker.stop()
    outcomes = sum((worker.outcomes for worker in workers), Counter())
    # The commands did race the workers: some turns were cut short by them.
    assert outcomes[TurnOutcome.DEPOSED] > 0, outcomes

    states = dict(WorkflowRun.objects.values_list("pk", "status"))
    for run_id in runs:
        status = states[uuid_of(run_id)]
        expected = {"cancel": {"cancelled"}, "suspend": {"suspended"}}.get(
            last.get(run_id, ""), {"completed"}
        )
        assert status in expected, (run_id, last.get(run_id), status)
    assert set(succeeded) >= {"cancel", "suspend", "resume"}, succeeded
    # No step was recorded after its run's terminal transition.
    for run in WorkflowRun.objects.filter(status__in=["cancelled", "completed"]):
        latest = (
            Step.objects.filter(run=run).order_by("-created_at").values_list("created_at", flat=True).first()
        )
        assert latest is None or latest <= run.finished_at + timedelta(milliseconds=1), run.pk
    assert not Update.objects.exists()


def uuid_of(run_id: str) -> Any:
    import uuid

    return uuid.UUID(run_id)


def test_lifecycle_commands(capsys: Any) -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    handle = client.start("tests.sleepy", kwargs={"seconds": 60}, id="cmd-run")
    park(handle.run_id)
    call_command("weft_suspend", "cmd-run")
    call_command("weft_resume", handle.run_id)
    call_command("weft_cancel", "cmd-run", "--reason", "operator")
    out = capsys.readouterr().out
    assert "suspended run cmd-run: now suspended" in out
    assert "resumed run" in out and "now running" in out
    assert "cancelled run cmd-run: now cancelled" in out
    assert run_of(handle).error["reason"] == "operator"
    with pytest.raises(CommandError, match="finished run cannot be cancelled"):
        call_command("weft_cancel", "cmd-run")
    with pytest.raises(CommandError, match="only a failed run can be retried"):
        call_command("weft_retry", "cmd-run")


def test_a_wake_discarded_on_a_stale_status_keeps_the_rearmed_timer() -> None:
    from django_weft.store import DjangoStore

    handle = client.start("tests.sleepy", kwargs={"seconds": 60})
    park(handle.run_id)
    # The caller saw the run suspended; it was resumed and parked again since.
    assert DjangoStore().turns.claims._discard_wake(handle.run_id, "suspended") == "kept"
    assert Timer.objects.filter(run_id=handle.run_id, kind="sleep").unfired().exists()


def test_retry_keeps_the_execution_deadline() -> None:
    handle = client.start("tests.l.eight_steps", args=["dl"], execution_timeout="1h")
    assert drive(handle.run_id) == "failed"
    handle.retry()
    timer = Timer.objects.get(run_id=handle.run_id, kind="deadline")
    assert timer.fire_at == run_of(handle).execution_deadline


def test_cancel_by_an_old_run_id_reaches_the_run_it_continued_as() -> None:
    handle = client.start("tests.countdown", args=[5])
    first = handle.run_id
    assert make_engine().run_turn(first) == TurnOutcome.CONTINUED
    assert client.get_handle(first).cancel() == "cancelled"
    successor = WorkflowRun.objects.get(workflow_id=handle.workflow_id, status="cancelled")
    assert str(successor.pk) != first
