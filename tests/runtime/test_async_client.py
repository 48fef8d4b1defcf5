"""The async client: the awaited twins of the client's calls, and waits that hold no
thread and no database connection between their looks."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.db import connection, connections
from django.test import AsyncClient

from django_weft import (
    ResultTimeout,
    UpdateTimeout,
    UpdateValidationError,
    WorkflowCancelled,
    WorkflowNotFound,
    WorkflowTerminalError,
    client,
)
from django_weft.models import WorkflowRun
from django_weft.runtime import awaiting
from django_weft.testing import drive
from tests.support.driver import Driver, park

pytestmark = pytest.mark.django_db(transaction=True)

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Await ``coroutine`` on an event loop in this thread, as an async view would."""
    return asyncio.run(coroutine)


@pytest.fixture(autouse=True)
def _close_other_threads_connections() -> Iterator[None]:
    """The connections of asgiref's sync thread and of the looks' thread, closed after
    each test, as the end of a request would (the test database is dropped at the end)."""
    yield
    run(sync_to_async(connections.close_all)())
    awaiting._looks.executor.submit(connections.close_all).result()


def test_start_signal_and_await_the_result() -> None:
    async def scenario() -> tuple[str, Any, str, dict[str, Any]]:
        handle = await client.astart("tests.async.greet", args=["Hello"], id=f"greet-{uuid.uuid4()}")
        accepted = await handle.asignal("name", "Ada")
        result = await handle.aresult(timeout=20)
        return accepted.name, result, await handle.astatus(), await handle.adescribe()

    worker = Driver()
    try:
        name, result, status, described = run(scenario())
    finally:
        worker.stop()
    assert (name, result, status) == ("name", "Hello, Ada", "completed")
    assert described["status"] == "completed" and described["result"] == "Hello, Ada"


def test_signal_with_start_get_handle_query_read_and_cancel() -> None:
    workflow_id = f"greet-{uuid.uuid4()}"

    async def scenario() -> tuple[Any, ...]:
        handle = await client.asignal_with_start(
            "tests.async.greet", args=["Hi"], id=workflow_id, signal="other", payload=1
        )
        again = await client.aget_handle(workflow_id)
        await sync_to_async(park)(handle.run_id)
        greeting = await again.aquery("greeting")
        record = await again.aread()
        status = await again.acancel("not needed")
        with pytest.raises(WorkflowCancelled):
            await again.aresult(timeout=5)
        return again == handle, greeting, record.workflow_id, status

    assert run(scenario()) == (True, "Hi", workflow_id, "cancelled")


def test_updates_are_validated_applied_and_awaited() -> None:
    handle = client.start("tests.async.greet", args=["Hello"])
    park(handle.run_id)

    async def refused() -> None:
        await handle.aupdate("greeting", "")

    with pytest.raises(UpdateValidationError, match="non-empty string"):
        run(refused())

    async def not_applied_yet() -> str:
        with pytest.raises(UpdateTimeout) as caught:
            await handle.aupdate("greeting", "Howdy", update_id="u-1", wait=0.05)
        return caught.value.update_id

    assert run(not_applied_yet()) == "u-1"

    async def applied() -> tuple[Any, Any, Any]:
        stored = await handle.aupdate_result("u-1", wait=20)
        again = await handle.aupdate("greeting", "Howdy", update_id="u-1")  # the stored outcome
        fresh = await handle.aupdate("greeting", "Hey", wait=20)
        return stored, again, fresh

    worker = Driver()
    try:
        assert run(applied()) == ("Howdy", "Howdy", "Hey")
    finally:
        worker.stop()


def test_errors_are_the_sync_client_s() -> None:
    handle = client.start("tests.echo", args=["done"])
    assert drive(handle.run_id) == "completed"
    waiting = client.start("tests.async.greet", args=["Hello"])

    async def scenario() -> None:
        with pytest.raises(WorkflowNotFound):
            await client.aget_handle("no-such-workflow")
        with pytest.raises(WorkflowNotFound):
            await client.WorkflowHandle(str(uuid.uuid4()), "gone").aresult(timeout=1)
        with pytest.raises(WorkflowTerminalError):
            await handle.asignal("late")
        with pytest.raises(ResultTimeout) as caught:
            await waiting.aresult(timeout=0.1)
        assert caught.value.run_id == waiting.run_id
        assert await handle.aresult() == {"args": ["done"], "kwargs": {}}

    started = time.monotonic()
    run(scenario())
    assert time.monotonic() - started < 5


def test_a_cancelled_wait_leaves_nothing_behind() -> None:
    handle = client.start("tests.async.greet", args=["Hello"])
    threads_before = threading.active_count()

    async def scenario() -> int:
        waits = [asyncio.ensure_future(handle.aresult()) for _ in range(20)]
        await asyncio.sleep(0.3)
        during = awaiting.awaited_waits()
        for wait in waits:
            wait.cancel()
        results = await asyncio.gather(*waits, return_exceptions=True)
        assert all(isinstance(result, asyncio.CancelledError) for result in results)
        return during

    assert run(scenario()) == 20
    assert awaiting.awaited_waits() == 0
    # The looks' thread gave its connection back once no wait was left (CONN_MAX_AGE=0 here).
    looks_connection_open = awaiting._looks.executor.submit(
        lambda: connections["default"].connection is not None
    ).result()
    assert not looks_connection_open
    assert threading.active_count() <= threads_before + 2  # the looks' thread, asgiref's sync thread
    # The run is as it was: nothing was written by the waits.
    assert handle.status() == "running"


@pytest.mark.postgres
def test_200_concurrent_waits_hold_at_most_two_connections_between_looks() -> None:
    """Counted in pg_stat_activity: the backends of this database other than the ones
    open before the waits began (this thread's) and the counting one (asgiref's sync
    thread, which the signals use too)."""
    handles = [client.start("tests.async.greet", args=["Hi"]) for _ in range(200)]
    warm = Driver()  # park them all: a wait then sees "waiting" until its signal
    try:
        deadline = time.monotonic() + 60
        while client.WorkflowHandle(handles[-1].run_id, "").status() != "waiting":
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        warm.stop()
    before = _backends()

    async def scenario() -> tuple[list[int], list[Any], int]:
        waits = [asyncio.ensure_future(handle.aresult(timeout=120)) for handle in handles]
        counts: list[int] = []
        threads = 0
        for _ in range(8):
            await asyncio.sleep(0.25)
            counts.append(await sync_to_async(_count_new_backends)(before))
            threads = max(threads, threading.active_count())
        assert not any(wait.done() for wait in waits)
        worker = Driver()
        try:
            for handle in handles:
                await handle.asignal("name", handle.run_id[:8])
            results = await asyncio.gather(*waits)
        finally:
            await sync_to_async(worker.stop)()
        return counts, results, threads

    started = time.monotonic()
    counts, results, threads = run(scenario())
    print(
        f"\n200 concurrent aresult waits: connections besides the test's own, sampled 8 times "
        f"0.25 s apart: {counts}; peak threads in the process: {threads}; "
        f"all 200 results in {time.monotonic() - started:.1f} s"
    )
    assert results == [f"Hi, {handle.run_id[:8]}" for handle in handles]
    assert max(counts) <= 2, counts
    assert min(counts) >= 1, counts  # the looks do use a connection: the count sees them


# -- an async view (tests/testapp/views.py) through Django's AsyncClient -----------------------


def test_an_async_view_starts_signals_and_awaits_a_run() -> None:
    async def scenario() -> Any:
        response = await AsyncClient().post(
            "/async/greet/", {"greeting": "Hello", "name": "Grace"}, content_type="application/json"
        )
        return response.status_code, response.json()

    worker = Driver()
    try:
        status, body = run(scenario())
    finally:
        worker.stop()
    assert status == 200, body
    assert body["result"] == "Hello, Grace" and body["status"] == "completed"
    assert WorkflowRun.objects.get(pk=body["run_id"]).status == "completed"


@pytest.mark.postgres
def test_concurrent_requests_waiting_in_async_views_hold_no_connection_each() -> None:
    """Each request in a ThreadSensitiveContext, as Django's ASGI handler runs it (the
    test client does not), so each has a sync thread of its own: the start and the signal
    run there, and the connections counted while the views wait are only the looks'."""
    requests = 20
    before = _backends()

    async def one_request() -> Any:
        async with ThreadSensitiveContext():
            response = await AsyncClient().post(
                "/async/greet/", {"greeting": "Hi", "name": "Ada"}, content_type="application/json"
            )
        return response.status_code, response.json()

    async def scenario() -> tuple[list[int], list[Any]]:
        views = [asyncio.ensure_future(one_request()) for _ in range(requests)]
        deadline = time.monotonic() + 30
        while awaiting.awaited_waits() < requests:
            assert time.monotonic() < deadline, awaiting.awaited_waits()
            await asyncio.sleep(0.05)
        counts = []
        for _ in range(5):
            counts.append(await sync_to_async(_count_new_backends)(before))
            await asyncio.sleep(0.2)
        worker = Driver()
        try:
            responses = await asyncio.gather(*views)
        finally:
            await sync_to_async(worker.stop)()
        return counts, responses

    counts, responses = run(scenario())
    print(f"\n{requests} async views waiting: connections besides the test's own, sampled 5 times: {counts}")
    assert [status for status, _ in responses] == [200] * requests
    assert {body["result"] for _, body in responses} == {"Hi, Ada"}
    assert max(counts) <= 2, counts


def _backends() -> set[int]:
    """This database's backends now, this thread's included."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        return {pid for (pid,) in cursor.fetchall()}


def _count_new_backends(before: set[int]) -> int:
    """This database's backends that are not in ``before``, the counting one left out."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND NOT (pid = ANY(%s))",
            [sorted(before)],
        )
        return int(cursor.fetchone()[0])
