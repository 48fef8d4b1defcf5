"""What a schedule does when its time comes: which scheduled times start a run, which
are missed, and what the overlap policy does about a run of the schedule still open.

Pure decisions; the runtime applies them in the tick (one transaction per schedule), so
starting the runs and advancing the schedule commit together or not at all.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from .schedule_spec import ScheduleSpec

MAX_FIRES_PER_TICK = 1000
"""At most this many scheduled times of one schedule are started in one tick; the rest
stay due and the next tick continues (``next_fire_at`` is the first one not yet done)."""

MAX_MISSED_PER_TICK = 5000
"""A cron schedule's missed fires are counted one by one (20 to 35 µs each: its cron
arithmetic in its time zone), at most this many in one tick; the rest stay due and the
next tick goes on counting, so a long outage never holds a tick's transaction long."""


class OverlapPolicy(enum.StrEnum):
    """What a fire does while the schedule's previous run is still open."""

    SKIP = "skip"
    """Do not start; count the fire as skipped (the default)."""
    BUFFER_ONE = "buffer_one"
    """Start it once the open run finishes; while one fire waits, later ones are skipped."""
    BUFFER_ALL = "buffer_all"
    """Start each, one after another, as the open runs finish."""
    CANCEL_OTHER = "cancel_other"
    """Ask the open run to cancel (a cancellation request: it may clean up), and start
    once it has finished; while one fire waits, later ones are skipped."""
    TERMINATE_OTHER = "terminate_other"
    """Terminate the open run, then start."""
    ALLOW_ALL = "allow_all"
    """Start regardless: runs may overlap."""


class FireAction(enum.StrEnum):
    START = "start"
    SKIP = "skip"
    BUFFER = "buffer"
    CANCEL_OTHER_AND_WAIT = "cancel_other"
    TERMINATE_OTHER_AND_START = "terminate_other"


def decide_overlap(policy: str, *, open_run: bool, buffered: int) -> FireAction:
    """The action for one scheduled time, given whether the schedule's latest run is
    still open and how many fires wait in its buffer."""
    policy = OverlapPolicy(policy)
    if policy == OverlapPolicy.ALLOW_ALL:
        return FireAction.START
    if not open_run and buffered == 0:
        return FireAction.START
    if policy == OverlapPolicy.SKIP:
        return FireAction.SKIP
    if policy == OverlapPolicy.BUFFER_ONE:
        return FireAction.BUFFER if buffered == 0 else FireAction.SKIP
    if policy == OverlapPolicy.BUFFER_ALL:
        return FireAction.BUFFER
    if not open_run:  # a buffer left from an earlier policy: start
        return FireAction.START
    if policy == OverlapPolicy.CANCEL_OTHER:
        return FireAction.CANCEL_OTHER_AND_WAIT if buffered == 0 else FireAction.SKIP
    return FireAction.TERMINATE_OTHER_AND_START


@dataclass(frozen=True)
class DueFires:
    """The scheduled times a tick found due for one schedule."""

    start: list[datetime]
    """Due and within the catch-up window, oldest first: start (subject to overlap)."""
    missed: int
    """Due but older than the catch-up window: counted, not started."""
    last_missed: datetime | None
    next_fire_at: datetime | None
    """The first scheduled time not handled by this tick (``None``: the schedule ended)."""
    counting: bool = False
    """More missed fires remain to count: ``next_fire_at`` is the first of them (a cron
    schedule more than :data:`MAX_MISSED_PER_TICK` behind), nothing starts this tick."""


def due_fires(spec: ScheduleSpec, next_fire_at: datetime, now: datetime, catchup_window: float) -> DueFires:
    """Split the scheduled times from ``next_fire_at`` up to ``now`` into missed ones
    (older than ``now - catchup_window``) and ones to start (at most
    :data:`MAX_FIRES_PER_TICK`). A cron schedule counts at most
    :data:`MAX_MISSED_PER_TICK` missed times a tick: further behind, it starts nothing
    now, and the next tick goes on counting from where this one stopped."""
    cutoff = now - timedelta(seconds=catchup_window)
    missed = 0
    last_missed: datetime | None = None
    moment: datetime | None = next_fire_at
    later = spec.times_after(next_fire_at)
    if moment is not None and moment < cutoff:
        # Skip the missed ones without starting anything: count them.
        if spec.every is not None:  # arithmetic: an outage of days at every=1s is cheap
            end = cutoff
            if spec.end_at is not None and spec.end_at < cutoff:
                end = spec.end_at + timedelta(microseconds=1)
            missed = _interval_count(spec, moment, end)
            last_missed = _interval_last(spec, moment, end) if missed else None
            later = spec.times_after(cutoff - timedelta(microseconds=1))
            moment = next(later, None)
        else:
            while moment is not None and moment < cutoff and missed < MAX_MISSED_PER_TICK:
                missed += 1
                last_missed = moment
                moment = next(later, None)
            if moment is not None and moment < cutoff:
                # The next tick goes on counting from here: the schedule stays due.
                return DueFires([], missed, last_missed, next_fire_at=moment, counting=True)
    start: list[datetime] = []
    while moment is not None and moment <= now and len(start) < MAX_FIRES_PER_TICK:
        start.append(moment)
        moment = next(later, None)
    return DueFires(start=start, missed=missed, last_missed=last_missed, next_fire_at=moment)


def _interval_count(spec: ScheduleSpec, first: datetime, before: datetime) -> int:
    """How many interval fire times ``t`` with ``first <= t < before`` (``first`` is one)."""
    assert spec.every is not None
    if before <= first:
        return 0
    span = (before - first).total_seconds()
    count = int(span // spec.every) + 1
    # The last counted one must be strictly before ``before``.
    if first + timedelta(seconds=(count - 1) * spec.every) >= before:
        count -= 1
    return count


def _interval_last(spec: ScheduleSpec, first: datetime, before: datetime) -> datetime:
    assert spec.every is not None
    count = _interval_count(spec, first, before)
    return first + timedelta(seconds=(count - 1) * spec.every)


def workflow_id_for(schedule_id: str, scheduled_at: datetime) -> str:
    """The workflow id of the run started for ``scheduled_at``: the fire's idempotency key."""
    return f"{schedule_id}-{scheduled_at.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
