"""Inline activity attempts: the one call_activity path and its one retryable rule."""

from __future__ import annotations

from typing import Any

import pytest

from django_weft.engine.attempt import ActivityInfo, activity_info, call_activity
from django_weft.engine.errors import ActivityFailed
from django_weft.engine.executor import TurnOutcome
from django_weft.engine.registry import Activity
from django_weft.engine.retry import RetryPolicy

from .conftest import Harness

INFO = ActivityInfo("run", "wf", "name", "act", 3, 1)


def flaky(failures: int) -> Activity[..., str]:
    attempts: list[int] = []

    def body() -> str:
        attempts.append(len(attempts) + 1)
        if len(attempts) <= failures:
            raise ConnectionError(f"attempt {len(attempts)}")
        return f"ok after {len(attempts)}"

    return Activity(
        fn=body, name="activities.flaky", retry=RetryPolicy(max_attempts=3, initial_interval="1ms")
    )


@pytest.mark.parametrize(
    ("error", "retryable"),
    [(ConnectionError("down"), True), (KeyError("k"), False)],
)
def test_the_policy_decides_what_is_retried(error: Exception, retryable: bool) -> None:
    def fail() -> None:
        raise error

    policy = RetryPolicy(non_retryable=(KeyError,))
    attempt = call_activity(Activity(fn=fail, name="a"), INFO, (), {}, policy=policy)
    assert attempt.error is not None and attempt.error["message"] == str(error)
    assert attempt.retryable is retryable


def test_a_result_that_is_not_json_is_never_retried() -> None:
    attempt = call_activity(Activity(fn=object, name="a"), INFO, (), {}, policy=RetryPolicy())
    assert attempt.error is not None and attempt.error["type"] == "django_weft.engine.errors.PayloadError"
    assert attempt.retryable is False


def test_the_attempt_sees_its_activity_info() -> None:
    attempt = call_activity(
        Activity(fn=lambda: activity_info().idempotency_key, name="a"), INFO, (), {}, policy=RetryPolicy()
    )
    assert attempt.value == "run:3" and attempt.result_json == '"run:3"'


def test_short_retries_run_inline_within_the_turn(weft: Harness) -> None:
    act = flaky(failures=2)

    @weft.workflow("activities.inline")
    def inline(ctx: Any) -> str:
        return str(ctx.run(act))

    run_id = weft.store.start("activities.inline")
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == "ok after 3"
    assert weft.step(run_id, 0).attempt == 3


def test_long_retries_park_the_run_on_a_timer(weft: Harness) -> None:
    act = flaky(failures=1)
    act.retry = RetryPolicy(max_attempts=2, initial_interval="30s")

    @weft.workflow("activities.durable")
    def durable(ctx: Any) -> str:
        return str(ctx.run(act))

    run_id = weft.store.start("activities.durable")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    assert weft.step(run_id, 0).status == "retrying"
    weft.store.advance(31)
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == "ok after 2"


def test_exhausted_attempts_raise_activity_failed_in_the_workflow(weft: Harness) -> None:
    act = flaky(failures=5)

    @weft.workflow("activities.exhausted")
    def exhausted(ctx: Any) -> list[Any]:
        try:
            ctx.run(act)
        except ActivityFailed as exc:
            return [exc.attempt, exc.cause_type, exc.cause_message]
        return []

    run_id = weft.store.start("activities.exhausted")
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == [3, "ConnectionError", "attempt 3"]
    assert weft.step(run_id, 0).status == "failed"


def test_an_atomic_attempt_that_fails_records_nothing_until_it_succeeds(weft: Harness) -> None:
    act = flaky(failures=1)
    act.atomic = True
    recorded_during_attempts: list[int] = []

    original = act.fn

    def watched() -> str:
        recorded_during_attempts.append(len(weft.store.history(run_id)))
        return original()

    act.fn = watched

    @weft.workflow("activities.atomic")
    def atomic(ctx: Any) -> str:
        return str(ctx.run(act))

    run_id = weft.store.start("activities.atomic")
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert recorded_during_attempts == [0, 0]
    assert [(s.status, s.attempt) for s in weft.store.history(run_id)] == [("completed", 2)]
