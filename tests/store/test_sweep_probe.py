"""The sweep's probe: one statement says which parts of a sweep have work, an idle sweep
is that statement alone, and work of every kind the sweep does is seen and done in the
same sweep."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_weft import client
from django_weft.engine.registry import registry
from django_weft.models import Schedule, WorkflowRun
from django_weft.runtime import sweep as sweep_module
from django_weft.runtime import tick
from django_weft.runtime.bulk_jobs import start_bulk_job
from django_weft.runtime.dispatch import LocalDispatcher
from django_weft.runtime.sweep import TickReport
from django_weft.store import DjangoStore, SweepWork
from tests.support.driver import park

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_chores() -> Iterator[None]:
    """No retention pass in these sweeps (it runs once a minute per process)."""
    last = sweep_module._last_purge[0]
    sweep_module._last_purge[0] = time.monotonic()
    yield
    sweep_module._last_purge[0] = last


def pending() -> SweepWork:
    return DjangoStore().probe.pending(
        grace=0.5,
        workflows=registry.workflow_names(),
        workflow_limits=registry.concurrency_limits(),
        activity_limits=registry.activity_concurrency_limits(),
    )


def worker_tick() -> TickReport:
    """A sweep as ``weft_worker`` runs it: its own workflows, sent to its own threads."""
    return tick(LocalDispatcher(), redispatch_after=0.0, workflows=registry.workflow_names())


def parked_far_away() -> str:
    """A run asleep for an hour, and a schedule next due in an hour: nothing due."""
    handle = client.start("tests.sleepy", kwargs={"seconds": 3600})
    park(handle.run_id)
    client.create_schedule("hourly", "tests.echo", args=[1], every="1h")
    return handle.run_id


def test_an_idle_sweep_is_one_statement() -> None:
    parked_far_away()
    assert pending() == SweepWork()
    with CaptureQueriesContext(connection) as queries:
        report = worker_tick()
    assert (report.fired, report.dispatched, report.schedules) == (0, 0, 0)
    assert len(queries) == 1, [query["sql"] for query in queries]
    assert queries[0]["sql"].startswith("SELECT EXISTS")


def test_a_due_timer_is_seen_fired_and_its_run_dispatched_in_one_sweep() -> None:
    handle = client.start("tests.sleepy", kwargs={"seconds": 0.05})
    park(handle.run_id)
    time.sleep(0.1)
    assert pending() == SweepWork(timers=True)
    report = worker_tick()
    assert report.fired == 1
    assert report.run_ids == [handle.run_id]  # woken, then dispatched by the same sweep


def test_a_started_run_nobody_dispatched_is_seen_and_dispatched() -> None:
    handle = client.start("tests.echo", args=[1])
    assert pending().dispatch
    assert worker_tick().run_ids == [handle.run_id]


def test_an_expired_lease_is_seen_and_taken_over() -> None:
    run_id = parked_far_away()
    WorkflowRun.objects.filter(pk=run_id).update(
        status="running", owner_id="gone", lease_expires_at=timezone.now() - timedelta(seconds=5)
    )
    assert pending() == SweepWork(dispatch=True)
    assert worker_tick().taken_over == [run_id]


def test_a_due_schedule_is_seen_and_fired_and_its_run_dispatched() -> None:
    parked_far_away()
    Schedule.objects.filter(pk="hourly").update(next_fire_at=timezone.now() - timedelta(seconds=1))
    assert pending() == SweepWork(schedules_due=True)
    report = worker_tick()
    assert report.schedules == 1
    assert len(report.run_ids) == 1  # the run it started, dispatched by the same sweep


def test_an_open_bulk_job_is_seen_and_worked_on() -> None:
    run_id = parked_far_away()
    start_bulk_job("cancel", {"workflow_name": "tests.sleepy"})
    assert pending() == SweepWork(bulk=True)
    assert worker_tick().bulk == 1
    assert WorkflowRun.objects.get(pk=run_id).status == "cancelled"


def test_a_parent_left_waiting_on_a_finished_child_is_seen_and_woken() -> None:
    parent = client.start("tests.c.parent", args=["left", 0.05], id="left")
    park(parent.run_id)
    child = WorkflowRun.objects.get(parent_id=parent.run_id)
    # The child finished, and the process died before it woke its parent.
    WorkflowRun.objects.filter(pk=child.pk).update(status="completed", owner_id=None)
    assert pending() == SweepWork(parents=True)
    assert worker_tick().run_ids == [parent.run_id]


def test_a_worker_with_no_workflow_registered_still_sweeps() -> None:
    # Its sweep dispatches nothing to its own threads, and fires timers for everyone.
    handle = client.start("tests.sleepy", kwargs={"seconds": 0.05})
    park(handle.run_id)
    time.sleep(0.1)
    work = DjangoStore().probe.pending(grace=0.5, workflows=frozenset())
    assert work == SweepWork(timers=True)
    report = tick(LocalDispatcher(), redispatch_after=0.0, workflows=frozenset())
    assert (report.fired, report.dispatched) == (1, 0)


def test_a_child_a_timed_out_parent_sends_its_cancellation_request_is_dispatched_in_that_sweep() -> None:
    options = {"seconds": 3600, "policy": "request_cancel"}
    parent = client.start("tests.c.parent", args=["rc"], kwargs=options, execution_timeout=0.3)
    park(parent.run_id)
    child = WorkflowRun.objects.get(parent_id=parent.run_id)
    park(str(child.pk))  # asleep for an hour
    time.sleep(0.4)
    assert pending() == SweepWork(timers=True)  # the parent's deadline, nothing runnable yet
    report = worker_tick()
    assert WorkflowRun.objects.get(pk=parent.run_id).status == "timed_out"
    assert str(child.pk) in report.closed_children
    assert str(child.pk) in report.run_ids  # woken to receive the request: sent at once, not a tick later


@pytest.mark.postgres
def test_workflow_names_with_a_percent_sign_are_probed_as_they_are() -> None:
    """On PostgreSQL the probe's values are written into its text (``with_values``): a
    ``%`` in a name is neither a placeholder nor an escape."""
    names = ["discount 10%", "a%sb", "a%%b"]
    for name in names:
        WorkflowRun.objects.create(workflow_name=name, workflow_id=f"percent {name}", status="running")
    for name in names:
        assert DjangoStore().probe.pending(grace=0.5, workflows=[name]).dispatch, name
    assert not DjangoStore().probe.pending(grace=0.5, workflows=["a%b", "discount 10"]).dispatch
