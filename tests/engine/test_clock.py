"""The clock seam and activity overrides, in the engine (no Django)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from django_weft.engine import activity_overrides, clock
from django_weft.engine.attempt import ActivityInfo, call_activity
from django_weft.engine.executor import TurnOutcome
from django_weft.engine.registry import Activity
from django_weft.engine.retry import RetryPolicy

from .conftest import Harness

START = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def virtual() -> Iterator[clock.VirtualClock]:
    installed = clock.VirtualClock(START)
    clock.install(installed)
    yield installed
    clock.uninstall(installed)


def test_a_virtual_clock_moves_only_forward_and_only_when_told() -> None:
    moving = clock.VirtualClock(START)
    assert moving.now() == START and moving.elapsed() == 0
    assert moving.advance(90) == START + timedelta(seconds=90)
    assert moving.advance_to(START) == START + timedelta(seconds=90)  # not backwards
    assert moving.advance_to(START + timedelta(days=1)) == START + timedelta(days=1)
    assert moving.elapsed() == 86400
    with pytest.raises(ValueError, match="only moves forward"):
        moving.advance(-1)
    with pytest.raises(ValueError, match="timezone-aware"):
        clock.VirtualClock(datetime(2030, 1, 1))


def test_one_clock_at_a_time(virtual: clock.VirtualClock) -> None:
    assert clock.installed() is virtual
    with pytest.raises(RuntimeError, match="installed already"):
        clock.install(clock.VirtualClock())
    clock.uninstall(clock.VirtualClock())  # not the installed one: nothing happens
    assert clock.installed() is virtual


def test_sleep_and_monotonic_follow_the_virtual_clock(virtual: clock.VirtualClock) -> None:
    wall = time.monotonic()
    origin = clock.monotonic()
    clock.sleep(3600)
    assert clock.monotonic() - origin == 3600
    assert virtual.now() == START + timedelta(hours=1)
    assert time.monotonic() - wall < 5  # the thread did not sleep the hour


def test_without_a_virtual_clock_time_is_real() -> None:
    assert clock.installed() is None
    before = clock.monotonic()
    clock.sleep(0.01)
    assert clock.monotonic() - before >= 0.01


def test_an_inline_retry_delay_advances_the_virtual_clock_seen_by_ctx_now(
    weft: Harness, virtual: clock.VirtualClock
) -> None:
    failures = [ConnectionError("down")]

    def body() -> str:
        if failures:
            raise failures.pop()
        return "up"

    flaky = Activity(fn=body, name="clock.flaky", retry=RetryPolicy(max_attempts=2, initial_interval=0.04))

    @weft.workflow("clock.retry")
    def retry(ctx: Any) -> list[Any]:
        before = ctx.now()
        value = ctx.run(flaky)
        return [value, (ctx.now() - before).total_seconds()]

    run_id = weft.store.start("clock.retry")
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    # The 40 ms delay was slept on the virtual clock: exactly 40 ms passed for the workflow.
    assert weft.store.runs[run_id].result == ["up", 0.04]
    assert virtual.now() == START + timedelta(milliseconds=40)


def test_an_override_replaces_the_activity_body_until_removed() -> None:
    act = Activity(fn=lambda value: f"real {value}", name="clock.act")
    info = ActivityInfo("run", "wf", "name", "clock.act", 0, 1)
    activity_overrides.override("clock.act", lambda value: f"fake {value}")
    try:
        assert call_activity(act, info, (1,), {}, policy=RetryPolicy()).value == "fake 1"
        other = Activity(fn=lambda: "other", name="clock.other")
        assert call_activity(other, info, (), {}, policy=RetryPolicy()).value == "other"
    finally:
        activity_overrides.remove("clock.act")
    assert call_activity(act, info, (1,), {}, policy=RetryPolicy()).value == "real 1"
