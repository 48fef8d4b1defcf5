"""Flow control of activities as an operator sees it (the admin's dashboard and
``weft_status``): the rate limit buckets that are behind, and the busiest activity
concurrency groups.

Reads only, through the store (docs/explanation/flow-control.md, "Rate limits" and
"Activity slots"). A rate and a limit are the ones this process's code declares (a
rate overridden by ``WEFT_RATE_LIMITS`` is the override's); ``None`` when the name is not
registered here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from ..conf import weft_settings
from ..engine.flow import Rate, from_micros
from ..engine.registry import registry
from .process import get_store
from .slots import BUSIEST_SHOWN


@dataclass(frozen=True)
class BucketFigures:
    """A rate limit bucket whose next free moment is ahead of now."""

    name: str
    key: str
    """The bucket's key; ``""`` for a limit without keys."""
    rate: Rate | None
    """The rate in force: ``WEFT_RATE_LIMITS``' for its name, else the registered
    ``RateLimit``'s; ``None`` when neither is known to this process."""
    free_at: datetime
    """The bucket's next free moment: an attempt taking a moment now is given this one."""
    backlog: timedelta
    """How far ahead of now that moment is."""

    @property
    def backlog_attempts(self) -> int | None:
        """About how many attempts the backlog is at the rate (the attempts already given
        a moment ahead of now, give or take one); ``None`` when the rate is unknown."""
        if self.rate is None:
            return None
        return round(self.backlog / timedelta(microseconds=self.rate.interval_us))


@dataclass(frozen=True)
class BusyBuckets:
    """The buckets whose next free moment is furthest ahead."""

    buckets: tuple[BucketFigures, ...]
    read_at: datetime


def busy_rate_limits(
    top: int = BUSIEST_SHOWN, *, now: datetime | None = None, may_lag: bool = False
) -> BusyBuckets:
    """The ``top`` rate limit buckets whose next free moment is after ``now`` (the
    database clock by default), the furthest ahead first. One query, on the index of
    the buckets' ``tat``: it reads those rows and none of the rest of the table.
    ``may_lag``: read from ``WEFT_READ_DATABASE``."""
    store = get_store(may_lag=may_lag)
    read_at = now if now is not None else store.db_now()
    overrides = weft_settings.RATE_LIMITS
    registered = registry.rate_limits()
    buckets = []
    for name, key, tat in store.activity_flow.busy_buckets(read_at, top):
        rate = registered[name].rate(overrides) if name in registered else overrides.get(name)
        free_at = from_micros(int(tat))
        buckets.append(
            BucketFigures(name=name, key=key, rate=rate, free_at=free_at, backlog=free_at - read_at)
        )
    return BusyBuckets(buckets=tuple(buckets), read_at=read_at)


@dataclass(frozen=True)
class ActivityGroupFigures:
    """One group of an activity's concurrency limit: the activity and a key."""

    activity: str
    key: str
    """The key; ``""`` for a limit without keys."""
    held: int
    """Slots held (their lease running)."""
    limit: int | None
    """The slots the activity declares; ``None`` when it is not registered here."""
    waiting: int
    """Attempts waiting for a slot."""
    oldest_waiting_at: datetime | None
    """When the attempt waiting longest was queued."""


@dataclass(frozen=True)
class BusiestActivityGroups:
    """The activity concurrency groups with the most attempts waiting, then the most
    slots held."""

    groups: tuple[ActivityGroupFigures, ...]
    read_at: datetime


def busiest_activity_groups(
    top: int = BUSIEST_SHOWN, *, now: datetime | None = None, may_lag: bool = False
) -> BusiestActivityGroups:
    """The ``top`` groups ``(activity, key)`` with the most attempts waiting for a slot,
    then the most slots held at ``now`` (the database clock by default), then by activity
    and key; groups with neither are left out. One grouped query over the slot rows,
    which are only the attempts holding or waiting for a slot. ``may_lag``: read from
    ``WEFT_READ_DATABASE``."""
    store = get_store(may_lag=may_lag)
    read_at = now if now is not None else store.db_now()
    limits = registry.activity_concurrency_limits()
    groups = tuple(
        ActivityGroupFigures(
            activity=row["activity"],
            key=row["key"],
            held=row["held"],
            limit=limits[row["activity"]].limit if row["activity"] in limits else None,
            waiting=row["waiting"],
            oldest_waiting_at=row["oldest"],
        )
        for row in store.activity_flow.busiest_groups(read_at, top)
    )
    return BusiestActivityGroups(groups=groups, read_at=read_at)


__all__ = [
    "ActivityGroupFigures",
    "BucketFigures",
    "BusiestActivityGroups",
    "BusyBuckets",
    "busiest_activity_groups",
    "busy_rate_limits",
]
