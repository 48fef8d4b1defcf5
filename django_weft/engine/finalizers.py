"""A finalizer's progress and the decisions on its attempts (retry, give up).

The store keeps the progress in the run's ``finalizer`` column (``status``, ``attempt``,
``activity``, ``error``...); these functions decide, the store persists.
"""

from __future__ import annotations

import enum
from typing import Any

from .retry import RetryPolicy


class FinalizerStatus(enum.StrEnum):
    PENDING = "pending"  # due: the first attempt waits to be sent
    RUNNING = "running"  # an attempt was taken; its timer is the attempt's lease
    RETRYING = "retrying"  # an attempt failed or was lost; the next one waits for the timer
    COMPLETED = "completed"
    FAILED = "failed"  # attempts exhausted, or a non-retryable error


STARTABLE_FINALIZER_STATUSES = frozenset({FinalizerStatus.PENDING, FinalizerStatus.RETRYING})
"""A finalizer in one of these states waits for its next attempt to be taken."""

UNFINISHED_FINALIZER_STATUSES = STARTABLE_FINALIZER_STATUSES | {FinalizerStatus.RUNNING}
"""A run whose finalizer is in one of these states still has work to do (not purged)."""


def retry_in(
    policy: RetryPolicy, attempt: int, error: dict[str, Any] | None, *, retryable: bool
) -> float | None:
    """Seconds until the next attempt after attempt ``attempt`` ended with ``error``, or
    ``None`` when there is none: it succeeded, its error is not retryable, or the policy's
    attempts are used up."""
    if error and retryable and attempt < policy.max_attempts:
        return policy.delay_after(attempt)
    return None


def lost_attempt_ends(policy: RetryPolicy, attempt: int) -> bool:
    """Whether a lost attempt ``attempt`` (its worker stopped before recording it) ends
    the finalizer as failed. Lost attempts count: one that kills its worker every time
    ends."""
    return attempt >= policy.max_attempts
