"""An activity's attempts that failed and were retried stay on its step
(``Step.failed_attempts``) after a later attempt succeeds or the last one fails: inline
retries in the turn, durable retries across turns, queued attempts. The admin's run page
shows them (docs/how-to/admin.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from django_weft import client
from django_weft.models import Step
from django_weft.testing import drive

pytestmark = pytest.mark.django_db(transaction=True)


def failed_of(run_id: str) -> list[dict[str, Any]]:
    return list(Step.objects.get(run_id=run_id, seq=0).failed_attempts or [])


def check_times(failed: dict[str, Any]) -> None:
    started, finished = (
        datetime.fromisoformat(failed["started_at"]),
        datetime.fromisoformat(failed["finished_at"]),
    )
    assert started <= finished


def test_inline_retries_in_the_turn_keep_each_failed_attempts_error() -> None:
    handle = client.start("tests.flaky", args=["inline", 2])
    assert drive(handle.run_id) == "completed"
    failed = failed_of(handle.run_id)
    assert [(f["attempt"], f["error"]["type"], f["error"]["message"]) for f in failed] == [
        (1, "ConnectionError", "attempt 1 failed"),
        (2, "ConnectionError", "attempt 2 failed"),
    ]
    assert "Traceback (most recent call last)" in "".join(failed[0]["error"]["traceback"])
    for each in failed:
        check_times(each)
    step = Step.objects.get(run_id=handle.run_id, seq=0)
    assert (step.status, step.attempt, step.error) == ("completed", 3, None)
    # Through the client's history too.
    assert handle.history()[0]["failed_attempts"] == failed


def test_durable_retries_carry_the_earlier_attempts_across_turns(settings: Any) -> None:
    settings.WEFT_RETRY_INLINE_MAX_DELAY = 0  # every retry waits for its timer, in a later turn
    handle = client.start("tests.flaky", args=["durable", 2])
    assert drive(handle.run_id) == "completed"
    failed = failed_of(handle.run_id)
    assert [(f["attempt"], f["error"]["message"]) for f in failed] == [
        (1, "attempt 1 failed"),
        (2, "attempt 2 failed"),
    ]
    assert Step.objects.get(run_id=handle.run_id, seq=0).attempt == 3


def test_an_activity_failing_for_good_keeps_the_attempts_before_its_last() -> None:
    handle = client.start("tests.always_fails", args=["for-good"])
    assert drive(handle.run_id) == "failed"
    step = Step.objects.get(run_id=handle.run_id, seq=0)
    assert (step.status, step.attempt, step.error["message"]) == ("failed", 3, "boom on attempt 3")
    assert [(f["attempt"], f["error"]["message"]) for f in failed_of(handle.run_id)] == [
        (1, "boom on attempt 1"),
        (2, "boom on attempt 2"),
    ]


def test_queued_attempts_keep_the_failed_ones() -> None:
    handle = client.start("tests.q.flaky", args=["queued", 2])
    assert drive(handle.run_id) == "completed"
    failed = failed_of(handle.run_id)
    assert [(f["attempt"], f["error"]["type"], f["error"]["message"]) for f in failed] == [
        (1, "RuntimeError", "flaky failure 1 of 2"),
        (2, "RuntimeError", "flaky failure 2 of 2"),
    ]
    assert all("retryable" not in f["error"] for f in failed)
    for each in failed:
        check_times(each)


def test_a_step_that_never_failed_has_none() -> None:
    handle = client.start("tests.flaky", args=["clean", 0])
    assert drive(handle.run_id) == "completed"
    assert Step.objects.get(run_id=handle.run_id, seq=0).failed_attempts is None
    assert handle.history()[0]["failed_attempts"] is None
