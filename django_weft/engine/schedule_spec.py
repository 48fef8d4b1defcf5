"""When a schedule fires: a cron expression in a time zone, or a fixed interval.

Pure computation on aware datetimes (every instant returned is in UTC); no database.

**Cron** expressions have 5 fields (minute hour day-of-month month day-of-week), or 6 with
a *leading* seconds field (``"30 0 9 * * mon-fri"`` is 09:00:30 on weekdays), or are one
of the aliases ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily``
(``@midnight``) and ``@hourly``. They are matched against the **wall-clock time** of the
schedule's IANA time zone. Around a daylight-saving change:

- a local time that does not exist that day (the hour skipped when clocks go forward) is
  **skipped**: ``30 2 * * *`` in Europe/Oslo does not fire on the last Sunday of March;
- a local time that occurs twice (the hour repeated when clocks go back) fires **once**,
  at its first occurrence.

**Intervals** (``every``) count in absolute time from the Unix epoch plus ``offset``:
``every=3600, offset=300`` fires at 00:05, 01:05, ... UTC whatever the time zone, 24
times on every day, DST or not.

``start_at``/``end_at`` bound the fire times (both inclusive). **Jitter** delays a fire
by up to the given duration, by an amount derived from the schedule id and the scheduled
time, so every process computes the same delay for the same fire.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

from .durations import Duration, parse_duration
from .errors import InvalidDuration, InvalidInput

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

MIN_INTERVAL = 1.0
"""The shortest ``every``: one second (the resolution of a scheduled run's workflow id)."""

_SEARCH_LIMIT = 100_000
"""How many wall-clock candidates the cron search looks at before it gives up (an
expression matching only times that never exist, say); far beyond any real gap."""


class InvalidSchedule(InvalidInput):
    """A schedule's spec or options are not usable; the message says what to fix, and
    ``field`` names the option at fault (``"cron"``, ``"every"``, ``"start_at"``...)."""

    field: str | None = None


def _seconds(value: Duration, what: str) -> float:
    try:
        return parse_duration(value, what=what)
    except InvalidDuration as exc:
        raise InvalidSchedule(str(exc), field=what) from None


def _aware_utc(value: datetime, what: str) -> datetime:
    if not isinstance(value, datetime):
        raise InvalidSchedule(f"{what} must be a datetime; got {type(value).__name__}", field=what)
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidSchedule(
            f"{what} must be timezone-aware (e.g. datetime(..., tzinfo=UTC)); got {value}", field=what
        )
    return value.astimezone(UTC)


def _zone(name: str) -> ZoneInfo:
    if not isinstance(name, str) or not name.strip():
        raise InvalidSchedule(
            f"timezone must be an IANA time zone name such as 'Europe/Oslo'; got {name!r}", field="timezone"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule(
            f"unknown time zone {name!r}; use an IANA name such as 'UTC', 'Europe/Oslo' or "
            "'America/New_York'",
            field="timezone",
        ) from None


CRON_MAX_LENGTH = 200
"""The longest cron expression a schedule stores (its column's length)."""


def normalize_cron(expression: str) -> tuple[str, bool]:
    """The expression with aliases expanded, and whether it has a seconds field.

    Raises :class:`InvalidSchedule` for anything croniter does not accept as 5 or 6
    fields, for unsupported aliases (``@reboot``) and for a 7th (year) field."""
    if not isinstance(expression, str):
        raise InvalidSchedule(
            f"cron must be a string such as '0 9 * * mon-fri'; got {type(expression).__name__}",
            field="cron",
        )
    text = " ".join(expression.split())
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            raise InvalidSchedule(
                f"unsupported cron alias {text!r}; use one of {', '.join(sorted(ALIASES))}, or 5 fields "
                "(minute hour day month weekday), or 6 with a leading seconds field",
                field="cron",
            )
        return ALIASES[text.lower()], False
    fields = text.split(" ") if text else []
    if len(fields) not in (5, 6):
        raise InvalidSchedule(
            f"cron {expression!r} has {len(fields)} field(s); give 5 (minute hour day month weekday) "
            "or 6 with a leading seconds field",
            field="cron",
        )
    seconds = len(fields) == 6
    if len(text) > CRON_MAX_LENGTH:
        raise InvalidSchedule(
            f"cron {expression!r} is {len(text)} characters long, more than {CRON_MAX_LENGTH}; use ranges "
            "and steps (1-5, */15) instead of long lists",
            field="cron",
        )
    if any(re.search(r"(^|[^a-z])r($|[^a-z])", field.lower()) for field in fields):
        # croniter draws a random value for R each time it reads the expression: every
        # process (and every look) would see other fire times.
        raise InvalidSchedule(
            f"cron {expression!r} uses R (a random value), which is drawn anew at every reading; write the "
            "value you want, or use jitter= to spread fires",
            field="cron",
        )
    try:
        croniter(text, datetime(2000, 1, 1), second_at_beginning=seconds)
    except (CroniterBadCronError, CroniterError, ValueError, KeyError) as exc:
        raise InvalidSchedule(f"invalid cron expression {expression!r}: {exc}", field="cron") from None
    return text, seconds


@dataclass(frozen=True)
class ScheduleSpec:
    """When a schedule fires. Build one with :meth:`build`, which checks everything."""

    cron: str | None = None
    every: float | None = None
    offset: float = 0.0
    timezone: str = "UTC"
    start_at: datetime | None = None
    end_at: datetime | None = None
    jitter: float = 0.0

    @classmethod
    def build(
        cls,
        *,
        cron: str | None = None,
        every: Duration | None = None,
        offset: Duration | None = None,
        timezone: str | None = None,
        start_at: datetime | None = None,
        end_at: datetime | None = None,
        jitter: Duration | None = None,
    ) -> ScheduleSpec:
        """A checked spec; raises :class:`InvalidSchedule` saying what to fix."""
        if (cron is None) == (every is None):
            raise InvalidSchedule(
                "give exactly one of cron= (an expression) or every= (an interval)", field="cron"
            )
        zone_name = "UTC" if timezone is None else timezone
        _zone(zone_name)
        seconds_every: float | None = None
        seconds_offset = 0.0
        if cron is not None:
            cron, _ = normalize_cron(cron)
            if offset is not None:
                raise InvalidSchedule(
                    "offset= applies to every= intervals; a cron expression sets the time itself",
                    field="offset",
                )
        else:
            assert every is not None
            seconds_every = _seconds(every, "every")
            if seconds_every < MIN_INTERVAL:
                raise InvalidSchedule(
                    f"every must be at least {MIN_INTERVAL:g} second; got {every!r}", field="every"
                )
            if offset is not None:
                seconds_offset = _seconds(offset, "offset")
                if seconds_offset >= seconds_every:
                    raise InvalidSchedule(
                        f"offset ({offset!r}) must be shorter than the interval ({every!r})",
                        field="offset",
                    )
        start = _aware_utc(start_at, "start_at") if start_at is not None else None
        end = _aware_utc(end_at, "end_at") if end_at is not None else None
        if start is not None and end is not None and end < start:
            raise InvalidSchedule(
                f"end_at ({end.isoformat()}) is before start_at ({start.isoformat()})", field="end_at"
            )
        seconds_jitter = _seconds(jitter, "jitter") if jitter is not None else 0.0
        spec = cls(
            cron=cron,
            every=seconds_every,
            offset=seconds_offset,
            timezone=zone_name,
            start_at=start,
            end_at=end,
            jitter=seconds_jitter,
        )
        if cron is not None and end is None and spec._never_fires(start):
            raise InvalidSchedule(f"cron {cron!r} never matches a date (e.g. 30 February)", field="cron")
        return spec

    # -- fire times -----------------------------------------------------------------------

    def next_after(self, after: datetime) -> datetime | None:
        """The first fire time strictly after ``after`` (UTC), or ``None`` when the
        schedule has ended (past ``end_at``, or a cron that matches no later date)."""
        return next(self.times_after(after), None)

    def times_after(self, after: datetime) -> Iterator[datetime]:
        """The fire times strictly after ``after`` (UTC), oldest first, until the schedule
        ends: what :meth:`next_after` gives when called on each in turn. A cron
        expression is read once for all of them (reading it is most of a time's cost)."""
        after = _aware_utc(after, "after")
        if self.start_at is not None and after < self.start_at:
            after = _just_before(self.start_at)
        # Past year 9999 (in UTC or in the zone's wall clock) no datetime can hold a time:
        # for this schedule there is none.
        try:
            moments = self._cron_times(after) if self.cron is not None else self._interval_times(after)
            for found in moments:
                if self.end_at is not None and found > self.end_at:
                    return
                yield found
        except (OverflowError, ValueError):
            return

    def fire_times(self, after: datetime, count: int) -> list[datetime]:
        """The next ``count`` fire times after ``after``."""
        return list(itertools.islice(self.times_after(after), count))

    def between(self, start: datetime, end: datetime) -> Iterator[datetime]:
        """Every fire time ``t`` with ``start <= t <= end``, oldest first."""
        end = _aware_utc(end, "end")
        for moment in self.times_after(_just_before(_aware_utc(start, "start"))):
            if moment > end:
                return
            yield moment

    def jitter_for(self, schedule_id: str, scheduled_at: datetime) -> timedelta:
        """The delay of the fire at ``scheduled_at``: in ``[0, jitter)``, the same in
        every process (a hash of the schedule id and the time, not a random draw)."""
        if self.jitter <= 0:
            return timedelta(0)
        key = f"{schedule_id}|{_aware_utc(scheduled_at, 'scheduled_at').isoformat()}".encode()
        fraction = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64
        return timedelta(seconds=math.floor(fraction * self.jitter * 1000) / 1000)

    def describe(self) -> str:
        """The spec in words, for listings: ``cron '0 9 * * *' in Europe/Oslo``, ``every 1h``."""
        if self.cron is not None:
            return f"cron {self.cron!r} in {self.timezone}"
        assert self.every is not None
        text = f"every {_seconds_text(self.every)}"
        return f"{text} at +{_seconds_text(self.offset)}" if self.offset else text

    # -- internals ------------------------------------------------------------------------

    def _never_fires(self, start: datetime | None) -> bool:
        """Whether the cron expression matches no date from ``start`` on (30 February)."""
        try:
            return next(self._cron_times(start or datetime(2000, 1, 1, tzinfo=UTC)), None) is None
        except (OverflowError, ValueError):
            return False  # it matched; the next match is past year 9999

    def _interval_times(self, after: datetime) -> Iterator[datetime]:
        while True:
            after = self._next_interval(after)
            yield after

    def _next_interval(self, after: datetime) -> datetime:
        assert self.every is not None
        since_epoch = (after - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() - self.offset
        # Whole microseconds avoid a float landing a hair before the boundary.
        step = math.floor(since_epoch / self.every) + 1
        moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=step * self.every + self.offset)
        while moment <= after:  # float rounding at an exact boundary
            step += 1
            moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=step * self.every + self.offset)
        return moment

    def _cron_times(self, after: datetime) -> Iterator[datetime]:
        """The cron's instants after ``after``, from one reading of the expression."""
        assert self.cron is not None
        zone = ZoneInfo(self.timezone)
        expression = self.cron  # normalized by build()
        seconds = len(expression.split(" ")) == 6
        # When ``after`` lies in the second pass of a repeated hour, the candidates left in
        # that hour map to their first pass, before ``after``, and are skipped below: a
        # repeated wall-clock time fires once.
        wall = after.astimezone(zone).replace(tzinfo=None, fold=0)
        candidates = croniter(expression, wall, second_at_beginning=seconds)
        skipped = 0
        while skipped < _SEARCH_LIMIT:
            try:
                local: datetime = candidates.get_next(datetime)
            except CroniterBadDateError:
                return
            instant = _existing_instant(local, zone)
            if instant is None or instant <= after:
                skipped += 1
                continue
            skipped = 0
            after = instant
            yield instant


def _just_before(moment: datetime) -> datetime:
    """The instant a microsecond earlier (the earliest datetime itself, which has none)."""
    try:
        return moment - timedelta(microseconds=1)
    except OverflowError:
        return moment


def _existing_instant(local: datetime, zone: ZoneInfo) -> datetime | None:
    """The UTC instant of wall-clock time ``local`` in ``zone``: its first occurrence if
    it occurs twice, ``None`` if the clocks skip it that day."""
    first = local.replace(tzinfo=zone, fold=0)
    instant = first.astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) != local:
        return None  # in the gap: converting back gives another wall time
    return instant


def _seconds_text(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
