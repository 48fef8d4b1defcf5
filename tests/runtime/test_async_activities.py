"""``async def`` activities on the Django store: inline in a turn, queued on a worker
(``run_activity``, what ``weft_worker`` and the Celery task call), and under the ``weft``
fixture."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from django_weft import WorkflowFailed, client
from django_weft.engine.attempt import _heartbeat_reads
from django_weft.models import Step
from django_weft.testing import drive, make_engine, run_queued_activities
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _close_other_threads_connections() -> Iterator[None]:
    """The async ORM of an activity runs on asgiref's sync thread, and its heartbeats read
    on the heartbeat thread: close their connections after the test (the test database
    is dropped at the end)."""
    yield
    asyncio.run(sync_to_async(connections.close_all)())
    _heartbeat_reads.submit(connections.close_all).result()


def test_an_async_activity_runs_inline_and_sees_its_activity_info() -> None:
    handle = client.start("tests.async.inline", args=["x"])
    assert drive(handle.run_id) == "completed"
    first, second = handle.result()
    assert first == {"value": "x", "activity": "tests.async.describe", "attempt": 1, "seq": 0}
    assert second["seq"] == 1
    assert list(Step.objects.filter(run_id=handle.run_id).values_list("status", flat=True)) == [
        "completed",
        "completed",
    ]


def test_an_async_activity_runs_queued_on_a_worker() -> None:
    handle = client.start("tests.async.queued", args=["q"])
    assert make_engine().run_turn(handle.run_id) == "parked"
    assert run_queued_activities(handle.run_id) == 1
    assert drive(handle.run_id) == "completed"
    assert handle.result() == {
        "value": "q",
        "activity": "tests.async.q.describe",
        "attempt": 1,
        "queued": True,
    }


def test_a_failing_async_activity_is_retried_by_its_policy() -> None:
    handle = client.start("tests.async.flaky", args=["retried", 2])
    assert drive(handle.run_id) == "completed"
    assert handle.result() == 3
    step = Step.objects.get(run_id=handle.run_id, seq=0)
    assert step.attempt == 3 and len(step.failed_attempts) == 2

    failing = client.start("tests.async.flaky", args=["exhausted", 5])
    assert drive(failing.run_id) == "failed"
    with pytest.raises(WorkflowFailed, match="attempt 3 fails"):
        failing.result()


def test_an_async_activity_writes_through_django_s_async_orm() -> None:
    handle = client.start("tests.async.record", args=["async-orm"])
    assert drive(handle.run_id) == "completed"
    assert handle.result() == 1
    assert SideEffect.objects.filter(key="async-orm").count() == 1


def test_an_async_activitys_orm_calls_run_in_the_thread_running_its_attempt() -> None:
    """Not on asgiref's one thread shared by the process: on the attempt's own thread and
    its connection, which the worker checks and closes as it does a sync activity's."""
    handle = client.start("tests.async.orm_thread")
    assert drive(handle.run_id) == "completed"
    assert handle.result() == {"orm": threading.current_thread().name, "row": "orm-thread"}


def test_an_async_activity_runs_when_its_turn_runs_in_asgirefs_sync_thread() -> None:
    """A turn driven from async code (``await sync_to_async(...)``): its thread is
    asgiref's one sync thread, where the activity's own sync_to_async calls also go."""
    handle = client.start("tests.async.orm_thread")
    outcome = asyncio.run(sync_to_async(drive)(handle.run_id))
    assert outcome == "completed"
    assert handle.result()["row"] == "orm-thread"


def test_an_async_activity_heartbeats_both_ways() -> None:
    handle = client.start("tests.async.heartbeats", args=[3])
    assert drive(handle.run_id) == "completed"
    assert handle.result() == 3


def test_a_queued_async_activity_stops_at_its_heartbeat_when_its_run_asks() -> None:
    handle = client.start("tests.async.cancellable", args=["stop"])
    assert make_engine().run_turn(handle.run_id) == "parked"
    handle.cancel("not needed", mode="request")
    run_queued_activities(handle.run_id)
    step = Step.objects.get(run_id=handle.run_id, seq=0)
    assert "CancellationRequested" in (step.error or {}).get("type", ""), step.error
