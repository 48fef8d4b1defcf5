"""``async def`` activities on the engine's one activity path, and the async functions the
decorators refuse."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from django_weft.engine.attempt import ActivityInfo, CancelProbe, activity_info, call_activity
from django_weft.engine.errors import ConfigurationError
from django_weft.engine.executor import TurnOutcome
from django_weft.engine.ports import get_coroutine_runner, set_coroutine_runner
from django_weft.engine.registry import Activity, activity, registry, workflow
from django_weft.engine.retry import RetryPolicy

from .conftest import Harness

INFO = ActivityInfo("run", "wf", "name", "act", 3, 1)


async def _describe(value: Any) -> dict[str, Any]:
    await asyncio.sleep(0)
    info = activity_info()
    return {"value": value, "seq": info.seq, "thread": threading.current_thread().name}


@pytest.fixture(autouse=True)
def _the_engines_own_runner() -> Iterator[None]:
    """The engine's coroutine runner (``asyncio.run`` in the calling thread), not the one
    the app installs in ``ready()`` (tests/runtime/test_async_activities.py has that one)."""
    previous = get_coroutine_runner()
    set_coroutine_runner(None)
    yield
    set_coroutine_runner(previous)


def test_an_async_activity_runs_to_its_end_in_the_calling_thread_and_sees_its_info() -> None:
    attempt = call_activity(Activity(fn=_describe, name="a"), INFO, (7,), {}, policy=RetryPolicy())
    assert attempt.error is None
    assert attempt.value == {"value": 7, "seq": 3, "thread": threading.current_thread().name}


def test_an_async_activity_called_where_an_event_loop_runs_gets_a_loop_of_its_own() -> None:
    async def caller() -> Any:
        return call_activity(Activity(fn=_describe, name="a"), INFO, ("in a loop",), {}, policy=RetryPolicy())

    attempt = asyncio.run(caller())
    assert attempt.error is None
    assert attempt.value["value"] == "in a loop" and attempt.value["seq"] == 3
    assert attempt.value["thread"].startswith("weft-async-activity")


def test_an_async_activity_s_exception_is_the_attempt_s_error() -> None:
    async def fails() -> None:
        await asyncio.sleep(0)
        raise ConnectionError("down")

    attempt = call_activity(
        Activity(fn=fails, name="a"), INFO, (), {}, policy=RetryPolicy(non_retryable=(KeyError,))
    )
    assert attempt.error is not None and attempt.error["type"] == "ConnectionError"
    assert attempt.retryable


def test_tasks_an_async_activity_leaves_running_end_with_its_attempt() -> None:
    finished: list[str] = []

    async def leaves_a_task() -> str:
        async def later() -> None:
            await asyncio.sleep(0.2)
            finished.append("late task")

        asyncio.get_running_loop().create_task(later())
        return "returned"

    attempt = call_activity(Activity(fn=leaves_a_task, name="a"), INFO, (), {}, policy=RetryPolicy())
    assert attempt.value == "returned"
    assert finished == []


@pytest.mark.parametrize("awaited", [True, False])
def test_a_heartbeat_in_an_async_activity_stops_it_when_its_run_asks(awaited: bool) -> None:
    checks: list[str] = []

    def check() -> str:
        checks.append(threading.current_thread().name)
        return "cancellation requested"

    info = ActivityInfo("run", "wf", "name", "act", 3, 1, CancelProbe(check))

    async def beats() -> str:
        if awaited:
            await activity_info().aheartbeat()
        else:
            activity_info().heartbeat()
        return "not stopped"

    attempt = call_activity(Activity(fn=beats, name="a"), info, (), {}, policy=RetryPolicy())
    assert attempt.error is not None and attempt.error["type"].endswith("CancellationRequested")
    assert not attempt.retryable
    # The read ran on the heartbeat thread, not on the activity's event loop.
    assert checks and checks[0].startswith("weft-heartbeat")


def test_async_activities_run_inline_with_retries_in_a_workflow(weft: Harness) -> None:
    attempts: list[int] = []

    async def flaky() -> str:
        await asyncio.sleep(0)
        attempts.append(activity_info().attempt)
        if len(attempts) < 3:
            raise ConnectionError("not yet")
        return f"ok on attempt {activity_info().attempt}"

    act = Activity(fn=flaky, name="async.flaky", retry=RetryPolicy(max_attempts=3, initial_interval="1ms"))

    @weft.workflow("async.flow")
    def flow(ctx: Any) -> list[Any]:
        return [ctx.run(act), ctx.run(_describe, "plain async callable")]

    run_id = weft.store.start("async.flow")
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    result = weft.store.runs[run_id].result
    assert result[0] == "ok on attempt 3" and attempts == [1, 2, 3]
    assert result[1]["value"] == "plain async callable" and result[1]["seq"] == 1


def test_async_activities_run_inline_in_a_workflow_driven_where_a_loop_runs(weft: Harness) -> None:
    @weft.workflow("async.in_loop")
    def flow(ctx: Any) -> Any:
        return ctx.run(_describe, "driven from async code")

    run_id = weft.store.start("async.in_loop")

    async def drive() -> TurnOutcome:
        return weft.turn(run_id)

    assert asyncio.run(drive()) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result["value"] == "driven from async code"


def test_an_async_workflow_is_refused_at_the_decorator() -> None:
    async def body(ctx: Any) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"replayed.*must be a plain function"):
        workflow(name="tests.async.refused_workflow")(body)
    assert "tests.async.refused_workflow" not in registry.workflows


def test_an_atomic_async_activity_is_refused_at_the_decorator() -> None:
    async def body() -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"atomic=True.*transaction cannot span"):
        activity(name="tests.async.refused_atomic", atomic=True)(body)
    assert "tests.async.refused_atomic" not in registry.activities
    assert activity(name="tests.async.not_atomic")(body).name == "tests.async.not_atomic"
    registry.unregister("tests.async.not_atomic")
