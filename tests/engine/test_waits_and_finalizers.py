"""The decisions the store asks the engine for: is a parked run's wait satisfied, what
happens to the timers of a discarded wake-up, is a finalizer attempt retried."""

from __future__ import annotations

import pytest

from django_weft import RetryPolicy
from django_weft.engine import finalizers
from django_weft.engine.error_types import ErrorType
from django_weft.engine.parking import (
    ParkedWait,
    TimerDisposition,
    children_to_check,
    discarded_wake_disposition,
    timers_surviving_collection,
)


def test_a_wait_on_all_activities_needs_every_one_finished_or_a_failed_attempt() -> None:
    wait = ParkedWait.of({"kind": "activities", "seqs": [1, 2], "mode": "all"})
    assert wait.step_seqs == [1, 2]
    assert not wait.satisfied_by([(1, "completed", "activity"), (2, "started", "activity")], set())
    assert wait.satisfied_by([(1, "completed", "activity"), (2, "completed", "activity")], set())
    assert wait.satisfied_by([(1, "lost", "activity"), (2, "started", "activity")], set())


def test_a_wait_on_any_activity_needs_one_finished() -> None:
    wait = ParkedWait.of({"kind": "activities", "seqs": [1, 2], "mode": "any"})
    assert not wait.satisfied_by([(1, "scheduled", "activity"), (2, "started", "activity")], set())
    assert wait.satisfied_by([(1, "scheduled", "activity"), (2, "completed", "activity")], set())


def test_a_child_step_counts_as_finished_once_its_run_is_not_live() -> None:
    wait = ParkedWait.of({"kind": "activities", "seqs": [3], "mode": "all"})
    steps = [(3, "waiting", "child")]
    assert children_to_check(steps) == [3]
    assert not wait.satisfied_by(steps, live_children={3})
    assert wait.satisfied_by(steps, live_children=set())


def test_background_attempts_that_need_a_decision_wake_any_wait() -> None:
    wait = ParkedWait.of({"kind": "sleep", "seqs": [9], "background": [4]})
    assert wait.seqs == ()  # not a wait on activities: its seqs do not count
    assert wait.satisfied_by([(4, "attempt_failed", "activity")], set())
    assert not wait.satisfied_by([(4, "started", "activity")], set())


def test_timers_of_a_discarded_wake_up() -> None:
    assert discarded_wake_disposition("waiting") == TimerDisposition.KEPT
    assert discarded_wake_disposition("suspended") == TimerDisposition.COLLECTED
    assert discarded_wake_disposition(None) == TimerDisposition.COLLECTED
    assert timers_surviving_collection("suspended") == {"deadline", "activity", "finalizer"}
    assert timers_surviving_collection("cancelled") == {"finalizer"}
    assert timers_surviving_collection(None) == set()


@pytest.mark.parametrize(
    ("attempt", "error", "retryable", "expected"),
    [
        (1, {"type": "x"}, True, 1.0),
        (2, {"type": "x"}, True, 2.0),
        (3, {"type": "x"}, True, None),  # attempts used up
        (1, {"type": "x"}, False, None),
        (1, None, True, None),  # it succeeded
    ],
)
def test_finalizer_retries_follow_the_policy(
    attempt: int, error: dict[str, str] | None, retryable: bool, expected: float | None
) -> None:
    assert finalizers.retry_in(RetryPolicy(), attempt, error, retryable=retryable) == expected


def test_lost_finalizer_attempts_count() -> None:
    assert not finalizers.lost_attempt_ends(RetryPolicy(max_attempts=2), 1)
    assert finalizers.lost_attempt_ends(RetryPolicy(max_attempts=2), 2)


def test_stored_names_keep_their_values() -> None:
    assert ErrorType.WORKER_LOST == "django_weft.WorkerLost"
    assert ErrorType.RUN_FINISHED == "django_weft.RunFinished"
    assert [str(status) for status in finalizers.FinalizerStatus] == [
        "pending",
        "running",
        "retrying",
        "completed",
        "failed",
    ]


def test_the_decision_modules_import_without_django() -> None:
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import sys\n"
        "for name in ('django', 'celery', 'rest_framework', 'kombu'):\n"
        "    sys.modules[name] = None\n"
        "import django_weft.engine.parking, django_weft.engine.finalizers, django_weft.engine.error_types\n"
    )
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
