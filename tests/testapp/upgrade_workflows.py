"""Workflows whose runs the upgrade test puts in flight at old schemas, written there as
the code of that time wrote them, and completes with the current code after migrating.

Each activity writes one ``SideEffect`` row per execution, so the test can tell a
recorded step that was replayed from one executed again.
"""

from __future__ import annotations

from typing import Any

from django_weft import RetryPolicy, activity, activity_info, workflow

from .models import SideEffect


@activity(name="tests.upgrade.step", retry=RetryPolicy(max_attempts=1))
def step(key: str, value: Any) -> Any:
    SideEffect.objects.create(key=key)
    return value


@activity(name="tests.upgrade.second_try", retry=RetryPolicy(max_attempts=3, initial_interval=60))
def second_try(key: str) -> dict[str, Any]:
    """Succeeds at whichever attempt it gets to; the test writes the failed first one."""
    SideEffect.objects.create(key=key)
    return {"key": key, "attempt": activity_info().attempt}


@workflow(name="tests.upgrade.sleeper")
def sleeper(ctx: Any, key: str) -> list[Any]:
    before = ctx.run(step, f"{key}:before", "before")
    ctx.sleep(3600)
    return [before, ctx.run(step, f"{key}:after", "after")]


@workflow(name="tests.upgrade.retrier")
def retrier(ctx: Any, key: str) -> dict[str, Any]:
    result: dict[str, Any] = ctx.run(second_try, key)
    return result


@workflow(name="tests.upgrade.three_steps")
def three_steps(ctx: Any, key: str) -> list[int]:
    return [ctx.run(step, f"{key}:{i}", i) for i in range(3)]


@workflow(name="tests.upgrade.greeting")
def greeting(ctx: Any, name: str) -> str:
    return f"hello {name}"


@workflow(name="tests.upgrade.approval")
def approval(ctx: Any) -> list[Any]:
    return [ctx.wait_signal("approve"), ctx.wait_signal("note")]
