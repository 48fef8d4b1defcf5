"""Workers say what they can run: a real ``weft_worker`` process without a workflow's
code never claims its runs nor fires its schedules, the dashboard lists them as runs no
live worker can execute and schedules none can fire, and a worker that has the workflow
then completes and fires them."""

from __future__ import annotations

import time
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_weft import client, runtime
from django_weft.models import Schedule, Worker, WorkflowRun

from .conftest import CeleryCluster, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LATE = "tests.late.greet"


def live_workers() -> tuple[runtime.WorkerRecord, ...]:
    return runtime.worker_coverage(runtime.status_report()).live


def dashboard() -> str:
    users = get_user_model().objects
    user = users.filter(username="root").first() or users.create_superuser("root", "root@example.com", "pw")
    browser = Client()
    browser.force_login(user)
    response = browser.get(reverse("admin:django_weft_workflowrun_dashboard"))
    assert response.status_code == 200
    return response.content.decode()


def test_a_worker_without_the_workflow_never_claims_its_run_and_one_with_it_completes_it(  # type: ignore[no-untyped-def]
    start_worker,
) -> None:
    Worker.objects.all().delete()
    lacking = start_worker(env_vars={"WEFT_TEST_WITHOUT_LATE": "1"})
    (advert,) = wait_for(live_workers, 30, "the first worker to advertise itself")
    assert advert.kind == "weft_worker" and "tests.echo" in advert.workflows
    assert LATE not in advert.workflows

    late = client.start(LATE, args=["ada"])
    client.create_schedule("late-hourly", LATE, args=["bo"], every="1h", catchup_window="1h")
    Schedule.objects.filter(pk="late-hourly").update(next_fire_at=timezone.now() - timedelta(minutes=1))
    echo = client.start("tests.echo", args=[1])
    assert echo.result(timeout=30) == {"args": [1], "kwargs": {}}  # the worker is working

    # Over 4 s, its sweep (every 0.2 s: twenty of them) and its threads never claim the late
    # run, and its tick never fires the late workflow's due schedule.
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        run = WorkflowRun.objects.get(pk=late.run_id)
        assert (run.status, run.owner_id, run.owner_epoch) == ("running", None, 0)
        assert Schedule.objects.get(pk="late-hourly").fired_count == 0
        time.sleep(0.25)
    assert WorkflowRun.objects.get(pk=late.run_id).dispatched_at is None  # not even marked as sent
    assert "not registered" not in lacking.log and LATE not in lacking.log

    coverage = runtime.worker_coverage(runtime.status_report())
    assert [(w.name, w.counts) for w in coverage.stranded] == [(LATE, {"running": 1})]
    page = dashboard()
    assert f'data-stranded="{LATE}"' in page
    assert f'data-worker="{advert.engine_id}"' in page
    out = StringIO()
    call_command("weft_status", stdout=out)
    assert f"runs no live worker can execute: 1\n  {LATE}: 1 (1 running)" in out.getvalue()
    assert f"due schedules no live worker can fire: 1\n  {LATE}: 1 (the oldest due" in out.getvalue()
    assert f'data-stranded-schedules="{LATE}"' in page

    start_worker()
    assert late.result(timeout=30) == "HELLO ADA"
    run = WorkflowRun.objects.get(pk=late.run_id)
    assert run.owner_epoch == 1  # claimed once, by the worker that has the workflow
    assert len(live_workers()) == 2
    assert runtime.worker_coverage(runtime.status_report()).stranded == ()
    fired = wait_for(lambda: list(Schedule.objects.filter(pk="late-hourly", fired_count=1)), 30, "its fire")
    assert fired[0].next_fire_at > timezone.now()
    assert runtime.worker_coverage(runtime.status_report()).stranded_schedules == ()
    page = dashboard()
    assert 'data-stranded="' not in page and 'data-stranded-schedules="' not in page

    lacking.signal(15)
    assert lacking.wait(15) == 0
    # A worker that stops cleanly deletes its row at once.
    assert [w.engine_id for w in live_workers()] != [advert.engine_id] and len(live_workers()) == 1


@pytest.mark.postgres
def test_a_celery_worker_without_the_workflow_never_claims_its_run_and_one_with_it_completes_it(
    celery_cluster: CeleryCluster,
) -> None:
    Worker.objects.all().delete()
    lacking = celery_cluster.worker(concurrency=2, WEFT_TEST_WITHOUT_LATE="1")
    celery_cluster.beat()
    lacking.wait_ready()
    # Its two pool processes advertise themselves from their start, before any task.
    adverts = wait_for(lambda: len(live_workers()) == 2 and live_workers(), 30, "the pool to advertise")
    assert {w.kind for w in adverts} == {"celery"} and not any(LATE in w.workflows for w in adverts)

    late = client.start(LATE, args=["bo"])
    echo = client.start("tests.echo", args=[2])
    assert echo.result(timeout=30) == {"args": [2], "kwargs": {}}
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        run = WorkflowRun.objects.get(pk=late.run_id)
        assert (run.status, run.owner_id, run.owner_epoch) == ("running", None, 0)
        time.sleep(0.25)
    coverage = runtime.worker_coverage(runtime.status_report())
    assert [(w.name, w.counts) for w in coverage.stranded] == [(LATE, {"running": 1})]

    celery_cluster.worker(concurrency=1).wait_ready()
    assert late.result(timeout=60) == "HELLO BO"
    assert WorkflowRun.objects.get(pk=late.run_id).owner_epoch == 1
    assert "released" not in lacking.log
