"""Workers say what they can run: the claim and a worker's own sweep take only runs of
the workflows registered in the worker, each worker process advertises its workflows and
activity queues, and the runs no live worker can execute are listed."""

from __future__ import annotations

import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db.models import F
from django.utils import timezone

from django_weft import client, runtime
from django_weft.conf import weft_settings
from django_weft.engine.executor import Engine
from django_weft.engine.registry import Registry, registry
from django_weft.models import Schedule, Timer, Worker, WorkflowRun
from django_weft.runtime import workers
from django_weft.runtime.process import CurrentDispatcher, get_engine
from django_weft.store import DjangoStore
from django_weft.testing import drive

pytestmark = pytest.mark.django_db(transaction=True)


def engine_with(*names: str) -> Engine:
    """An engine (a worker process) that has only the workflows ``names``."""
    own = Registry()
    for name in names:
        own.add_workflow(registry.workflows[name])
    return Engine(DjangoStore().turns, CurrentDispatcher(), weft_settings.engine_config, workflows=own)


def row(run_id: str) -> dict[str, object]:
    return WorkflowRun.objects.values().get(pk=run_id)


def test_a_runnable_run_of_a_workflow_the_engine_lacks_is_not_claimed_and_not_written() -> None:
    handle = client.start("tests.echo", args=[1])
    before = row(handle.run_id)
    assert engine_with("tests.sleepy").run_turn(handle.run_id) == "not_claimed"
    assert row(handle.run_id) == before
    assert engine_with("tests.echo").run_turn(handle.run_id) == "completed"
    assert row(handle.run_id)["owner_epoch"] == 1


def test_an_engine_without_workflows_claims_nothing() -> None:
    handle = client.start("tests.echo")
    assert engine_with().run_turn(handle.run_id) == "not_claimed"
    assert row(handle.run_id)["owner_epoch"] == 0


def test_a_woken_run_of_a_workflow_the_engine_lacks_keeps_its_due_timer() -> None:
    handle = client.start("tests.sleepy", kwargs={"seconds": 0.2})
    assert engine_with("tests.sleepy").run_turn(handle.run_id) == "parked"
    time.sleep(0.4)
    before = row(handle.run_id)
    assert engine_with("tests.echo").run_turn(handle.run_id) == "not_claimed"
    assert row(handle.run_id) == before
    assert Timer.objects.filter(run_id=handle.run_id, fired_at__isnull=True).count() == 1
    assert engine_with("tests.sleepy").run_turn(handle.run_id) == "completed"


def test_an_expired_lease_of_a_workflow_the_engine_lacks_is_not_taken_over() -> None:
    handle = client.start("tests.echo")
    WorkflowRun.objects.filter(pk=handle.run_id).update(
        owner_id="gone", owner_epoch=1, lease_expires_at=timezone.now() - timedelta(minutes=5)
    )
    before = row(handle.run_id)
    assert engine_with("tests.sleepy").run_turn(handle.run_id) == "not_claimed"
    assert row(handle.run_id) == before
    assert engine_with("tests.echo").run_turn(handle.run_id) == "completed"
    assert row(handle.run_id)["owner_epoch"] == 2


def test_a_worker_sweep_marks_dispatched_only_runs_of_its_workflows(advertising: object) -> None:
    # No worker rows: beat's sweep then holds no run back for want of a live worker.
    echo = client.start("tests.echo")
    sleepy = client.start("tests.sleepy")
    sweep = DjangoStore().sweep
    runnable, *_ = sweep.claim_dispatch_batch(100, 0.0, 0.5, workflows={"tests.echo"})
    assert runnable == [echo.run_id]
    assert row(sleepy.run_id)["dispatched_at"] is None
    runnable, *_ = sweep.claim_dispatch_batch(100, 0.0, 0.5, workflows=set())
    assert runnable == []
    # Whether a run dispatched a moment ago is sent again depends on how long it waited
    # before (growing intervals): not what this test is about, so echo is undispatched again.
    WorkflowRun.objects.filter(pk=echo.run_id).update(dispatched_at=None)
    runnable, *_ = sweep.claim_dispatch_batch(100, 0.0, 0.5)  # beat's sweep: every run
    assert sorted(runnable) == sorted([echo.run_id, sleepy.run_id])


# -- adverts --------------------------------------------------------------------------------


@pytest.fixture
def advertising() -> object:
    """No worker rows before the test or after it: a heartbeat thread writes them on a
    connection of its own, outside the test's transaction."""
    Worker.objects.all().delete()
    yield
    workers.stop_advertising()
    Worker.objects.all().delete()


def test_a_worker_process_advertises_its_workflows_and_queues_and_deletes_its_row_on_stop(
    advertising: object,
) -> None:
    workers.advertise_now()
    assert not Worker.objects.exists()  # a process that is not a worker never advertises
    workers.advertise_as("celery", consumed_queues={"emails", "celery"})
    workers.advertise_now()
    (worker,) = Worker.objects.all()
    assert worker.engine_id == get_engine().engine_id and worker.kind == "celery"
    assert worker.workflows == sorted(registry.workflow_names())
    assert worker.activity_queues == sorted(registry.activity_queues() & {"emails", "celery"})
    first_beat = worker.heartbeat_at
    time.sleep(0.02)
    workers.advertise_now()
    worker.refresh_from_db()
    assert worker.heartbeat_at > first_beat and worker.started_at == first_beat
    workers.stop_advertising()
    assert not Worker.objects.exists()


def test_a_starting_worker_sends_out_again_the_runs_the_sweep_held_back(advertising: object) -> None:
    handle = client.start("tests.echo")
    now = timezone.now()
    WorkflowRun.objects.filter(pk=handle.run_id).update(
        dispatched_at=now - timedelta(minutes=30), ready_at=now - timedelta(hours=2)
    )
    # Sent after waiting 90 minutes, 30 minutes ago: the sweep's back-off holds it an hour more.
    assert DjangoStore().sweep.claim_dispatch_batch(100, 0.0, 0.5)[:2] == ([], [])
    workers.advertise_as("weft_worker")
    workers.advertise_now()
    assert row(handle.run_id)["dispatched_at"] is None
    assert DjangoStore().sweep.claim_dispatch_batch(100, 0.0, 0.5)[:2] == ([handle.run_id], [])


def test_runs_no_live_worker_can_execute_are_listed_by_workflow(advertising: object) -> None:
    echo = client.start("tests.echo")
    client.start("tests.sleepy")
    client.start("tests.sleepy", id="second")
    assert drive(echo.run_id) == "completed"  # finished runs need no worker
    coverage = runtime.worker_coverage(runtime.status_report())
    assert coverage.live == ()
    assert [(w.name, w.counts) for w in coverage.stranded] == [("tests.sleepy", {"running": 2})]

    Worker.objects.create(
        engine_id="other", kind="weft_worker", workflows=["tests.sleepy"],
        started_at=timezone.now(), heartbeat_at=timezone.now(),
    )  # fmt: skip
    coverage = runtime.worker_coverage(runtime.status_report())
    assert [w.engine_id for w in coverage.live] == ["other"] and coverage.stranded == ()

    # A worker whose heartbeat stopped more than a lease ago is not live.
    Worker.objects.update(heartbeat_at=F("heartbeat_at") - timedelta(seconds=weft_settings.LEASE_TTL + 1))
    coverage = runtime.worker_coverage(runtime.status_report())
    assert coverage.live == () and coverage.stranded_runs == 2
    out = StringIO()
    call_command("weft_status", stdout=out)
    assert (
        "live workers: 0\nruns no live worker can execute: 2\n  tests.sleepy: 2 (2 running)\n"
        in out.getvalue()
    )


def test_due_schedules_no_live_worker_can_fire_are_listed_by_workflow(advertising: object) -> None:
    for schedule_id in ("a", "b"):
        client.create_schedule(schedule_id, "tests.sleepy", every="1h")
    client.create_schedule("c", "tests.echo", every="1h")
    client.create_schedule("later", "tests.sleepy", every="1h")
    client.create_schedule("paused", "tests.sleepy", every="1h").pause()
    hour_ago = timezone.now() - timedelta(hours=1)
    Schedule.objects.exclude(pk="later").update(next_fire_at=hour_ago)
    Schedule.objects.filter(pk="b").update(next_fire_at=hour_ago + timedelta(minutes=30))
    Schedule.objects.filter(pk="later").update(next_fire_at=timezone.now() + timedelta(hours=1))

    coverage = runtime.worker_coverage(runtime.status_report())
    found = [(g.name, g.due, g.oldest_due_at) for g in coverage.stranded_schedules]
    assert found == [("tests.echo", 1, hour_ago), ("tests.sleepy", 2, hour_ago)]
    assert coverage.stranded_schedule_count == 3
    out = StringIO()
    call_command("weft_status", stdout=out)
    assert "due schedules no live worker can fire: 3\n  tests.echo: 1 (the oldest due 36" in out.getvalue()

    Worker.objects.create(
        engine_id="other", kind="weft_worker", workflows=["tests.sleepy"],
        started_at=timezone.now(), heartbeat_at=timezone.now(),
    )  # fmt: skip
    coverage = runtime.worker_coverage(runtime.status_report())
    assert [(g.name, g.due) for g in coverage.stranded_schedules] == [("tests.echo", 1)]
    Schedule.objects.filter(pk="c").update(next_fire_at=timezone.now() + timedelta(hours=1))
    out = StringIO()
    call_command("weft_status", stdout=out)
    assert "due schedules no live worker can fire: none\n" in out.getvalue()


def test_a_celery_worker_hands_a_turn_it_lacks_on_only_when_a_live_worker_has_the_workflow(
    advertising: object,
) -> None:
    from django_weft.engine.registry import registry as global_registry

    handle = client.start("tests.echo")
    WorkflowRun.objects.filter(pk=handle.run_id).update(dispatched_at=timezone.now())
    workers.advertise_as("celery")
    definition = global_registry.workflows.pop("tests.echo")
    try:
        workers.advertise_now()  # this worker, without tests.echo
        # No live worker has it: the mark stays, the sweep's back-off paces the resends.
        assert runtime.run_turn(handle.run_id) == "not_claimed"
        assert row(handle.run_id)["dispatched_at"] is not None
        Worker.objects.create(
            engine_id="other", kind="celery", workflows=["tests.echo"],
            started_at=timezone.now(), heartbeat_at=timezone.now(),
        )  # fmt: skip
        before = row(handle.run_id)
        assert runtime.run_turn(handle.run_id) == "not_claimed"
    finally:
        global_registry.workflows["tests.echo"] = definition
    # Another worker has it: sent again at the next sweep; nothing else written.
    assert row(handle.run_id) == {**before, "dispatched_at": None}
