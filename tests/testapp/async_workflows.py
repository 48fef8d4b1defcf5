"""Workflows and ``async def`` activities of the async client's tests."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from asgiref.sync import sync_to_async

from django_weft import RetryPolicy, activity, activity_info, workflow

from .models import SideEffect

NO_RETRY = RetryPolicy(max_attempts=1)

# How many times each key's flaky attempt has run (per process).
_attempts: dict[str, int] = {}
_attempts_lock = threading.Lock()


@activity(name="tests.async.describe", retry=NO_RETRY)
async def describe_attempt(value: Any) -> dict[str, Any]:
    """Awaits, then reports what ``activity_info()`` says inside the coroutine."""
    await asyncio.sleep(0.01)
    info = activity_info()
    return {"value": value, "activity": info.activity_name, "attempt": info.attempt, "seq": info.seq}


@activity(name="tests.async.q.describe", queue="tests", retry=NO_RETRY)
async def queued_describe_attempt(value: Any) -> dict[str, Any]:
    await asyncio.sleep(0.01)
    info = activity_info()
    return {"value": value, "activity": info.activity_name, "attempt": info.attempt, "queued": True}


@activity(name="tests.async.flaky", retry=RetryPolicy(max_attempts=3, initial_interval=0.01, backoff=1.0))
async def flaky(key: str, failures: int) -> int:
    """Fails its first ``failures`` attempts, then returns the attempt number."""
    await asyncio.sleep(0)
    with _attempts_lock:
        _attempts[key] = _attempts.get(key, 0) + 1
    if activity_info().attempt <= failures:
        raise RuntimeError(f"attempt {activity_info().attempt} fails")
    return activity_info().attempt


@activity(name="tests.async.record", retry=NO_RETRY)
async def record(key: str) -> int:
    """Writes a row through Django's async ORM."""
    await SideEffect.objects.acreate(key=key)
    return await SideEffect.objects.filter(key=key).acount()


@activity(name="tests.async.orm_thread", retry=NO_RETRY)
async def orm_thread() -> dict[str, str]:
    """Where Django's async ORM ran for this activity, and where its attempt did."""
    created = await SideEffect.objects.acreate(key="orm-thread")
    connection_thread = await sync_to_async(lambda: threading.current_thread().name)()
    return {"orm": connection_thread, "row": str(created.key)}


@activity(name="tests.async.heartbeats", retry=NO_RETRY)
async def heartbeats(count: int) -> int:
    """Heartbeats ``count`` times, both ways."""
    info = activity_info()
    for _ in range(count):
        await info.aheartbeat()
        info.heartbeat()
        await asyncio.sleep(0.01)
    return count


@activity(name="tests.async.q.wait_for_cancel", queue="tests", retry=NO_RETRY)
async def wait_for_cancel(key: str) -> str:
    """Heartbeats until its run asks it to stop (``CancellationRequested`` propagates)."""
    info = activity_info()
    for _ in range(500):
        await info.aheartbeat()
        await asyncio.sleep(0.02)
    return "never asked"


@workflow(name="tests.async.inline")
def inline(ctx: Any, value: Any) -> list[Any]:
    return [ctx.run(describe_attempt, value), ctx.run(describe_attempt, value)]


@workflow(name="tests.async.queued")
def queued(ctx: Any, value: Any) -> Any:
    return ctx.run(queued_describe_attempt, value)


@workflow(name="tests.async.flaky")
def flaky_workflow(ctx: Any, key: str, failures: int) -> int:
    return ctx.run(flaky, key, failures)


@workflow(name="tests.async.record")
def record_workflow(ctx: Any, key: str) -> int:
    return ctx.run(record, key)


@workflow(name="tests.async.orm_thread")
def orm_thread_workflow(ctx: Any) -> dict[str, str]:
    return ctx.run(orm_thread)


@workflow(name="tests.async.heartbeats")
def heartbeats_workflow(ctx: Any, count: int) -> int:
    return ctx.run(heartbeats, count)


@workflow(name="tests.async.cancellable")
def cancellable(ctx: Any, key: str) -> str:
    return ctx.run(wait_for_cancel, key)


@workflow(name="tests.async.greet")
def greet(ctx: Any, greeting: str) -> str:
    """Waits for signal "name", answers update "greeting" (validated) and query "greeting"."""
    state = {"greeting": greeting}

    def change(new: Any) -> str:
        state["greeting"] = new
        return new

    def must_be_text(new: Any) -> None:
        if not isinstance(new, str) or not new:
            raise ValueError("a greeting is a non-empty string")

    ctx.on_query("greeting", lambda: state["greeting"])
    ctx.on_update("greeting", change, validator=must_be_text)
    name = ctx.wait_signal("name")
    return f"{state['greeting']}, {name}"
