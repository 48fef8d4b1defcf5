"""Durations: seconds, ``timedelta`` or strings such as ``"30s"``, ``"1h"``, ``"2d"``."""

from __future__ import annotations

import re
from datetime import timedelta

from .errors import InvalidDuration

_UNITS: dict[str, float] = {
    "ms": 0.001, "msec": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
    "w": 604800.0, "week": 604800.0, "weeks": 604800.0,
}  # fmt: skip

_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*")

Duration = float | int | timedelta | str

MAX_SECONDS = 100 * 365.25 * 86400.0
"""The longest duration accepted: 100 years (infinity and overflowing dates are refused)."""
MAX_TEXT_LENGTH = 100
"""The longest duration string accepted ("1 week 2 days 3 hours" is 21 characters)."""


def parse_duration(value: Duration, *, what: str = "duration") -> float:
    """Return ``value`` as a number of seconds (a non-negative float).

    Accepts an ``int``/``float`` of seconds, a ``timedelta``, or a string made of
    ``<number><unit>`` parts: ``"90s"``, ``"1h30m"``, ``"1.5 hours"``, ``"2d"``.
    Raises :class:`InvalidDuration` with a message saying what was wrong.
    """
    if isinstance(value, bool):
        raise InvalidDuration(f"{what} must be seconds, a timedelta or a string like '30s'; got {value!r}")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _parse_string(value, what)
    else:
        raise InvalidDuration(
            f"{what} must be seconds, a timedelta or a string like '30s'; got {type(value).__name__}"
        )
    if seconds != seconds:
        raise InvalidDuration(f"{what} must be a number of seconds, not NaN; got {value!r}")
    if seconds < 0:
        raise InvalidDuration(f"{what} must not be negative; got {value!r}")
    if seconds > MAX_SECONDS:
        raise InvalidDuration(f"{what} is longer than 100 years; got {value!r}")
    return seconds


def _parse_string(text: str, what: str) -> float:
    stripped = text.strip()
    if not stripped:
        raise InvalidDuration(f"{what} is an empty string; write e.g. '30s', '5m', '1h' or '2d'")
    if len(stripped) > MAX_TEXT_LENGTH:
        raise InvalidDuration(
            f"{what} is {len(stripped)} characters long; a duration is at most {MAX_TEXT_LENGTH} "
            "(write e.g. '30s', '5m', '1h30m' or '2d')"
        )
    try:
        return float(stripped)
    except ValueError:
        pass
    total = 0.0
    position = 0
    for match in _PART.finditer(stripped):
        if match.start() != position:
            break
        unit = match.group(2).lower()
        if unit not in _UNITS:
            raise InvalidDuration(
                f"{what} {text!r} has an unknown unit {match.group(2)!r}; "
                "use ms, s, m, h, d or w (e.g. '30s', '1h30m')"
            )
        total += float(match.group(1)) * _UNITS[unit]
        position = match.end()
    if position != len(stripped) or position == 0:
        raise InvalidDuration(f"{what} {text!r} is not a duration; write e.g. '30s', '5m', '1h30m' or '2d'")
    return total
