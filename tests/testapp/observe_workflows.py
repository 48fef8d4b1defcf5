"""Workflows of the observation tests (metrics, logs): each real event happens a known
number of times, whatever the number of turns replaying it."""

from __future__ import annotations

import threading
from typing import Any

from django_weft import RetryPolicy, activity, activity_info, workflow

failures: dict[str, int] = {}
"""How many attempts of ``tests.obs.flaky`` still fail, by key (set by a test)."""
_lock = threading.Lock()


@activity(name="tests.obs.echo")
def echo(value: Any) -> Any:
    return value


@activity(name="tests.obs.flaky", retry=RetryPolicy(max_attempts=3, initial_interval=0.01, backoff=1.0))
def flaky(key: str) -> str:
    with _lock:
        left = failures.get(key, 0)
        failures[key] = max(0, left - 1)
    if left:
        raise RuntimeError(f"attempt {activity_info().attempt} of {key} fails")
    activity_info().logger.info("flaky %s succeeded", key)
    return key


@activity(name="tests.obs.queued", queue="tests")
def queued(value: Any) -> Any:
    activity_info().logger.info("queued %s", value)
    return value


@workflow(name="tests.obs.steps")
def observed_steps(ctx: Any, key: str) -> list[Any]:
    """An inline activity, a flaky one (retried inline), a durable sleep, a queued activity,
    then a signal: four turns, each replaying the steps before it. Logs one line per stage."""
    ctx.logger.info("begin %s", key)
    first = ctx.run(echo, key)
    second = ctx.run(flaky, key)
    ctx.logger.info("before the sleep %s", key)
    ctx.sleep(0.05)
    third = ctx.run(queued, key)
    ctx.logger.info("before the signal %s", key)
    fourth = ctx.wait_signal("go")
    ctx.logger.info("end %s", key)
    return [first, second, third, fourth]


@workflow(name="tests.obs.plain")
def plain(ctx: Any, count: int) -> int:
    """``count`` inline activities in one turn."""
    for index in range(count):
        ctx.run(echo, index)
    return count


@workflow(name="tests.obs.queued_steps")
def queued_steps(ctx: Any, count: int) -> int:
    """``count`` queued activities, one after the other: ``count + 1`` turns."""
    for index in range(count):
        ctx.run(queued, index)
    return count


@workflow(name="tests.obs.fan_out")
def fan_out(ctx: Any, children: int, steps: int) -> int:
    """``children`` runs of ``tests.obs.queued_steps`` started by this run's turn (so by a
    worker process), then waited for."""
    handles = [ctx.start_child("tests.obs.queued_steps", steps) for _ in range(children)]
    return sum(ctx.wait_all(handles))


@workflow(name="tests.obs.logged")
def logged(ctx: Any, sleeps: int) -> int:
    """A line, then a durable sleep, ``sleeps`` times, then a last line: the first line is
    replayed by each of the ``sleeps`` later turns."""
    for index in range(sleeps):
        ctx.logger.info("line %s", index)
        ctx.sleep(0.01)
    ctx.logger.info("last line")
    return sleeps


@activity(name="tests.obs.sometimes", retry=RetryPolicy(max_attempts=2, initial_interval=0.05))
def sometimes(index: int) -> int:
    """Fails for good when ``index`` is a multiple of 9; fails its first attempt (then
    succeeds) when it is a multiple of 4."""
    if index % 9 == 0 or (index % 4 == 0 and activity_info().attempt == 1):
        raise RuntimeError(f"run {index}, attempt {activity_info().attempt}")
    return index


@workflow(name="tests.obs.mixed")
def mixed(ctx: Any, index: int) -> int:
    """A little of everything the dashboard shows: an inline step, a durable sleep of
    0.1 to 0.9 s, a queued step, and a step that is retried or fails the run."""
    ctx.run(echo, index)
    ctx.sleep(0.1 * (1 + index % 9))
    ctx.run(queued, index)
    return ctx.run(sometimes, index)
