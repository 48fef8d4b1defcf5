"""The Prometheus metrics, recorded in this process (prometheus_client's default registry):
counters for real events only, the gauges the tick reads, and the ``/metrics`` view."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings
from prometheus_client import REGISTRY

from django_weft import client, metrics
from django_weft.engine.executor import TurnOutcome
from django_weft.runtime.dispatch import SweepOnlyDispatcher
from django_weft.runtime.schedules.firing import trigger_schedule
from django_weft.runtime.sweep import sample_queues, tick
from django_weft.testing import drive, make_engine, run_queued_activities
from tests.support.driver import depose_by_takeover
from tests.testapp import observe_workflows

pytestmark = pytest.mark.django_db(transaction=True)


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Deltas:
    """Sample values now, to compare with later (the registry is the process's, shared
    by every test)."""

    def __init__(self, *samples: tuple[str, dict[str, str]]) -> None:
        self.samples = samples
        self.before = [value(name, **labels) for name, labels in samples]

    def __call__(self) -> list[float]:
        now = [value(name, **labels) for name, labels in self.samples]
        return [after - before for after, before in zip(now, self.before, strict=True)]


@pytest.fixture(autouse=True)
def recording() -> Iterator[None]:
    metrics.enable()
    try:
        yield
    finally:
        metrics.disable()


def test_a_run_with_a_retried_activity_counts_each_real_attempt_once() -> None:
    observe_workflows.failures["metrics"] = 1
    deltas = Deltas(
        ("weft_runs_started_total", {"workflow": "tests.obs.steps"}),
        ("weft_runs_finished_total", {"workflow": "tests.obs.steps", "status": "completed"}),
        ("weft_activity_attempts_total", {"activity": "tests.obs.echo", "outcome": "completed"}),
        ("weft_activity_attempts_total", {"activity": "tests.obs.flaky", "outcome": "retried"}),
        ("weft_activity_attempts_total", {"activity": "tests.obs.flaky", "outcome": "completed"}),
        ("weft_activity_attempts_total", {"activity": "tests.obs.queued", "outcome": "completed"}),
        ("weft_activity_duration_seconds_count", {"activity": "tests.obs.flaky"}),
        ("weft_turn_duration_seconds_count", {"workflow": "tests.obs.steps"}),
        ("weft_schedule_to_start_seconds_count", {"kind": "first_turn"}),
        ("weft_schedule_to_start_seconds_count", {"kind": "woken"}),
        ("weft_schedule_to_start_seconds_count", {"kind": "activity"}),
    )
    handle = client.start("tests.obs.steps", args=["metrics"])
    engine = make_engine()
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED
    time.sleep(0.1)
    tick(SweepOnlyDispatcher())
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED
    run_queued_activities(handle.run_id)
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED
    handle.signal("go", 1)
    assert engine.run_turn(handle.run_id) == TurnOutcome.COMPLETED
    assert deltas() == [1, 1, 1, 1, 1, 1, 2, 4, 1, 3, 1]


def test_an_inline_activity_that_fails_for_good_and_its_run() -> None:
    observe_workflows.failures["for-good"] = 5  # more than its 3 attempts
    deltas = Deltas(
        ("weft_activity_attempts_total", {"activity": "tests.obs.flaky", "outcome": "retried"}),
        ("weft_activity_attempts_total", {"activity": "tests.obs.flaky", "outcome": "failed"}),
        ("weft_runs_finished_total", {"workflow": "tests.obs.steps", "status": "failed"}),
    )
    handle = client.start("tests.obs.steps", args=["for-good"])
    assert drive(handle.run_id) == "failed"
    assert deltas() == [2, 1, 1]


@pytest.mark.postgres
def test_a_takeover_and_a_deposed_write_are_counted() -> None:
    deltas = Deltas(("weft_lease_takeovers_total", {}), ("weft_deposed_writes_total", {}),
                    ("weft_schedule_to_start_seconds_count", {"kind": "takeover"}))  # fmt: skip
    handle = client.start("tests.fence_probe", args=["metrics"])
    assert depose_by_takeover(handle.run_id, "metrics-A", "metrics-B") == (
        TurnOutcome.DEPOSED,
        TurnOutcome.COMPLETED,
    )
    assert deltas() == [1, 1, 1]


def test_schedule_fires_are_counted_by_outcome() -> None:
    deltas = Deltas(
        ("weft_schedule_fires_total", {"schedule": "metrics-hourly", "outcome": "started"}),
        ("weft_schedule_fires_total", {"schedule": "metrics-hourly", "outcome": "skipped"}),
        ("weft_runs_started_total", {"workflow": "tests.obs.plain"}),
    )
    client.create_schedule("metrics-hourly", "tests.obs.plain", args=[1], every="1h", overlap="skip")
    trigger_schedule("metrics-hourly")
    trigger_schedule("metrics-hourly")  # its run is still open: skipped
    assert deltas() == [1, 1, 1]


def test_the_tick_sets_the_gauges_from_indexes() -> None:
    waiting = client.start("tests.m.sleep_with_handlers", args=[3600])
    assert make_engine().run_turn(waiting.run_id) == TurnOutcome.PARKED
    client.start("tests.obs.plain", args=[1])  # runnable, unclaimed: due now
    time.sleep(0.05)
    sample_queues(force=True)
    assert value("weft_runs", status="waiting", estimate="false") == 1
    assert value("weft_runs", status="running", estimate="false") == 1
    assert value("weft_oldest_due_seconds") > 0
    assert value("weft_due_timers") == 0
    assert value("weft_queues_sampled_at_seconds") > 0


@pytest.fixture
def staff_client() -> Client:
    user = User.objects.create_user("metrics-staff", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
    browser = Client()
    browser.force_login(user)
    return browser


@override_settings(ROOT_URLCONF="tests.metrics.urls")
def test_the_metrics_view_serves_the_registry_to_staff_who_may_view_runs(staff_client: Client) -> None:
    handle = client.start("tests.obs.plain", args=[2])
    drive(handle.run_id)
    response = staff_client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    body = response.content.decode()
    assert 'weft_runs_started_total{workflow="tests.obs.plain"}' in body
    assert "# TYPE weft_schedule_to_start_seconds histogram" in body


@override_settings(ROOT_URLCONF="tests.metrics.urls")
def test_the_metrics_view_refuses_anonymous_users_and_staff_without_the_permission() -> None:
    assert Client().get("/metrics").status_code == 403
    user = User.objects.create_user("metrics-bare", password="x", is_staff=True)
    browser = Client()
    browser.force_login(user)
    assert browser.get("/metrics").status_code == 403
    user.is_staff = False
    user.save()
    user.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
    assert browser.get("/metrics").status_code == 403


@override_settings(
    ROOT_URLCONF="tests.metrics.urls",
    WEFT_API_PERMISSION_CLASSES=["rest_framework.permissions.AllowAny"],
)
def test_the_metrics_view_follows_the_api_permission_classes() -> None:
    assert Client().get("/metrics").status_code == 200


@override_settings(
    ROOT_URLCONF="tests.metrics.urls",
    WEFT_API_PERMISSION_CLASSES=["rest_framework.permissions.IsAdminUser"],
)
def test_the_api_permission_classes_can_refuse_too(staff_client: Client) -> None:
    assert Client().get("/metrics").status_code in (401, 403)
    assert staff_client.get("/metrics").status_code == 200


@pytest.mark.postgres
def test_terminal_statuses_are_estimated_from_postgresqls_statistics_on_postgresql() -> None:
    from django.db import connection

    from django_weft.models import WorkflowRun

    for count in (1, 2, 3):
        assert drive(client.start("tests.obs.plain", args=[count]).run_id) == "completed"
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {WorkflowRun._meta.db_table}")
    sample_queues(force=True)
    # A table this small is read whole by ANALYZE: the estimate is the count.
    assert value("weft_runs", status="completed", estimate="true") == 3
    assert value("weft_runs", status="failed", estimate="true") == 0
