"""Workflows of the tests of the last step held back for the terminal commit
(tests/store/test_last_step.py)."""

from __future__ import annotations

from typing import Any

from django_weft import RetryPolicy, activity, activity_info, workflow
from django_weft.models import Step

from .models import SideEffect

NO_RETRY = RetryPolicy(max_attempts=1)


@activity(name="tests.ls.recorded_before", retry=NO_RETRY)
def recorded_before(key: str) -> list[int]:
    """The positions of this run's steps recorded when this attempt runs."""
    SideEffect.objects.create(key=key)
    info = activity_info()
    return sorted(Step.objects.filter(run_id=info.run_id).values_list("seq", flat=True))


@workflow(name="tests.ls.one_step")
def one_step(ctx: Any, key: str) -> list[int]:
    return ctx.run(recorded_before, key)


@workflow(name="tests.ls.three_steps")
def three_steps(ctx: Any, key: str) -> list[list[int]]:
    return [ctx.run(recorded_before, f"{key}:{index}") for index in range(3)]


@workflow(name="tests.ls.step_then_raise")
def step_then_raise(ctx: Any, key: str) -> None:
    ctx.run(recorded_before, key)
    raise ValueError(f"{key} fails after its step")


@workflow(name="tests.ls.step_then_sleep")
def step_then_sleep(ctx: Any, key: str) -> str:
    ctx.run(recorded_before, key)
    ctx.sleep(3600)
    return key


@workflow(name="tests.ls.step_then_unencodable")
def step_then_unencodable(ctx: Any, key: str) -> Any:
    ctx.run(recorded_before, key)
    return object()


@activity(name="tests.ls.quiet", retry=NO_RETRY)
def quiet(value: Any) -> Any:
    return value


@workflow(name="tests.ls.one_quiet_step")
def one_quiet_step(ctx: Any, value: Any) -> Any:
    return ctx.run(quiet, value)


@workflow(name="tests.ls.nap_then_step")
def nap_then_step(ctx: Any, key: str, seconds: float) -> list[int]:
    """A sleep whose end is held back, then an activity that reads what was recorded."""
    ctx.sleep(seconds)
    return ctx.run(recorded_before, key)


@activity(name="tests.ls.completed_before", retry=NO_RETRY)
def completed_before(key: str) -> list[int]:
    """The positions of this run's steps recorded as completed when this attempt runs."""
    info = activity_info()
    return sorted(Step.objects.filter(run_id=info.run_id, status="completed").values_list("seq", flat=True))


@activity(name="tests.ls.sleep_status", retry=NO_RETRY)
def sleep_status(key: str) -> str:
    """The status of this run's sleep (position 0) as recorded when this attempt runs."""
    return str(Step.objects.get(run_id=activity_info().run_id, seq=0).status)


@workflow(name="tests.ls.nap_then_sleep_status")
def nap_then_sleep_status(ctx: Any, key: str, seconds: float) -> str:
    ctx.sleep(seconds)
    return ctx.run(sleep_status, key)


@workflow(name="tests.ls.nap_then_two_steps")
def nap_then_two_steps(ctx: Any, key: str, seconds: float) -> list[list[int]]:
    ctx.sleep(seconds)
    return [ctx.run(completed_before, f"{key}:{index}") for index in range(2)]


@workflow(name="tests.ls.nap")
def nap(ctx: Any, seconds: float) -> str:
    ctx.sleep(seconds)
    return "rested"


@workflow(name="tests.ls.nap_phase")
def nap_phase(ctx: Any, key: str, seconds: float) -> str:
    """A query says whether the sleep is behind the workflow."""
    phase = {"value": "asleep"}
    ctx.on_query("phase", lambda: phase["value"])
    ctx.sleep(seconds)
    phase["value"] = "awake"
    return str(ctx.run(quiet, key))


@workflow(name="tests.ls.many_naps")
def many_naps(ctx: Any, count: int) -> int:
    """``count`` sleeps whose time has come at once, then the return."""
    for _ in range(count):
        ctx.sleep(0)
    return count
