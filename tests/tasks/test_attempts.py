"""What a task's result counts as its attempts, at the edges: several backends' retry
policies for one task, a worker lost while it waits to retry, a queued attempt no
worker took, a retried task, a mocked task, a task cancelled after a failed attempt."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from django_weft import client, runtime
from django_weft.engine import clock
from django_weft.tasks.framework import TaskResultStatus
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def test_each_backend_gives_its_own_retry_policy_to_the_same_task(weft: Any) -> None:
    # "default" has no OPTIONS retry: one attempt. "retrying" gives three.
    once = tasks.always_fails.enqueue("once")
    thrice = tasks.always_fails.using(backend="retrying").enqueue("thrice")
    again = tasks.always_fails.enqueue("once again")  # after the "retrying" copy was made
    weft.run_until_idle()
    for result in (once, thrice, again):
        result.refresh()
    assert (once.attempts, thrice.attempts, again.attempts) == (1, 3, 1)


def test_a_failed_attempt_whose_worker_dies_while_waiting_to_retry_keeps_its_error(
    weft: Any, monkeypatch: Any
) -> None:
    result = tasks.fails_until.enqueue("sleep-crash", 2)  # 3 attempts, 10 ms apart: waited inline
    real = clock.sleep
    crashed: list[float] = []

    def crash_once(seconds: float) -> None:
        if not crashed:
            crashed.append(seconds)
            raise tasks.WorkerCrash("the worker dies while waiting to retry")
        real(seconds)

    monkeypatch.setattr(clock, "sleep", crash_once)
    with pytest.raises(tasks.WorkerCrash):
        weft.run_until_idle()
    weft.advance(timedelta(minutes=5))
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 2)
    assert [e.exception_class for e in result.errors] == [RuntimeError]
    assert result.attempts == 2


def test_a_retried_task_starts_its_attempts_over(weft: Any) -> None:
    result = tasks.fails_until.enqueue("retry-over", 4)  # its 3 attempts fail
    weft.run_until_idle()
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 3)
    client.get_handle(result.id).retry()
    weft.run_until_idle()
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 4)
    assert (result.attempts, result.errors) == (1, [])


def test_a_queued_attempt_no_worker_took_is_no_attempt(weft: Any) -> None:
    result = tasks.send_email.enqueue("nobody@example.com")
    weft.engine.run_turn(result.id)  # the queued step is scheduled; no worker takes it
    runtime.get_store().attempts.lose_attempts([(uuid.UUID(result.id), 0)], weft.now())
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert (result.attempts, result.worker_ids, result.errors) == (0, [], [])


def test_a_task_mocked_by_the_test_toolkit_returns_the_mocks_value(weft: Any) -> None:
    weft.mock_activity(tasks.add, return_value=99)
    result = tasks.add.enqueue(1, 2)
    weft.run_until_idle()
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (TaskResultStatus.SUCCESSFUL, 99, 1)


def test_a_task_cancelled_after_a_failed_attempt_says_it_was_cancelled(weft: Any) -> None:
    result = tasks.slow_retry.enqueue()
    weft.run_until_idle()  # attempt 1 fails; attempt 2 waits a minute
    result.refresh()
    assert result.status == TaskResultStatus.READY and len(result.errors) == 1
    client.get_handle(result.id).cancel("not needed")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == [
        "builtins.RuntimeError",
        "django_weft.engine.errors.WorkflowCancelled",
    ]
