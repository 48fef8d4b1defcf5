"""The workflow of the tracing tests (tests/tracing, tests/integration/test_tracing_processes.py):
three activities, one of them failing its first attempt, a durable sleep and a signal."""

from __future__ import annotations

from typing import Any

from django_weft import RetryPolicy, activity, workflow

from .models import SideEffect


@activity(name="tests.traced.step", retry=RetryPolicy(max_attempts=1))
def traced_step(key: str, n: int) -> int:
    SideEffect.objects.create(key=f"{key}:step{n}")
    return n


@activity(name="tests.traced.flaky", retry=RetryPolicy(max_attempts=3, initial_interval=0.01, backoff=1.0))
def traced_flaky(key: str) -> int:
    """Fails its first attempt (counted in the database), then succeeds."""
    SideEffect.objects.create(key=f"{key}:flaky")
    attempts = SideEffect.objects.filter(key=f"{key}:flaky").count()
    if attempts == 1:
        raise RuntimeError("the first attempt fails")
    return attempts


@activity(name="tests.traced.queued", queue="tests", retry=RetryPolicy(max_attempts=1))
def traced_queued(key: str) -> str:
    SideEffect.objects.create(key=f"{key}:queued")
    return "queued"


@workflow(name="tests.traced")
def traced(ctx: Any, key: str, sleep: float = 0.2) -> dict[str, Any]:
    first = ctx.run(traced_step, key, 1)
    second = ctx.run(traced_flaky, key)
    ctx.sleep(sleep)
    payload = ctx.wait_signal("go")
    third = ctx.run(traced_step, key, 3)
    return {"steps": [first, second, third], "signal": payload}


@workflow(name="tests.traced_queued")
def traced_queued_workflow(ctx: Any, key: str) -> str:
    return str(ctx.run(traced_queued, key))
