"""Retention: how long terminal runs are kept, and which of them are due for deletion.

``WEFT_RETENTION`` gives a period per terminal status; ``@workflow(retention=...)`` may
override it for one workflow's runs. A run is due once its last change (``updated_at``,
normally when it finished) is older than the period of its status. A period of ``None``
keeps such runs forever. These functions only decide; the store deletes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .durations import Duration, parse_duration
from .errors import ConfigurationError
from .records import RunStatus

DEFAULT_RETENTION = "30d"
"""How long a terminal run is kept when neither the setting nor its workflow says."""

DEFAULT_KEY = "default"
"""The key of a retention dict that covers the terminal statuses it does not name."""

RETAINED_STATUSES: tuple[RunStatus, ...] = (
    RunStatus.COMPLETED,
    RunStatus.FAILED,
    RunStatus.CANCELLED,
    RunStatus.TIMED_OUT,
    RunStatus.CONTINUED,
)
"""The terminal statuses, in the order reports list them."""

RetentionValue = Duration | Mapping[str, Duration | None] | None
"""What ``WEFT_RETENTION`` and ``@workflow(retention=...)`` accept."""

Periods = Mapping[RunStatus, float | None]
"""Seconds a terminal run of each status is kept (``None``: forever)."""


class KeptReason(enum.StrEnum):
    """Why a due run was kept (a report counts them by these names)."""

    LIVE_CHILD = "live child"
    LIVE_PARENT = "live parent"
    FINALIZER = "finalizer to run"


def _shape_error(what: str, value: Any) -> ConfigurationError:
    return ConfigurationError(
        f"{what} must be a duration (e.g. '30d'), None to keep finished runs forever, or a dict of "
        f"durations by terminal status (e.g. {{'completed': '7d', 'failed': '90d', 'default': '30d'}}); "
        f"got {value!r}"
    )


def _entries(value: Mapping[Any, Any], what: str) -> dict[str, float | None]:
    """The dict form, checked: terminal statuses or ``"default"`` as keys, durations or
    ``None`` as values."""
    allowed = [*RETAINED_STATUSES, DEFAULT_KEY]
    entries: dict[str, float | None] = {}
    for key, period in value.items():
        if key not in allowed:
            active = isinstance(key, str) and key in {status.value for status in RunStatus}
            reason = " (only finished runs are deleted)" if active else ""
            raise ConfigurationError(
                f"{what} has the key {key!r}, which is not a terminal status{reason}; use "
                f"{', '.join(RETAINED_STATUSES)} or {DEFAULT_KEY!r}"
            )
        entries[str(key)] = None if period is None else parse_duration(period, what=f"{what}[{key!r}]")
    return entries


def parse_override(value: RetentionValue, *, what: str) -> dict[str, float | None]:
    """A workflow's own retention as given to ``@workflow(retention=...)``: a duration for
    all its terminal runs, or a dict by terminal status (``"default"`` for the statuses it
    does not name, ``None`` to keep forever). Statuses it leaves out follow
    ``WEFT_RETENTION``. ``None`` means no override (an empty dict).

    Raises :class:`ConfigurationError` or :class:`InvalidDuration` saying what to fix."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return _entries(value, what)
    if isinstance(value, int | float | timedelta | str):
        return {DEFAULT_KEY: parse_duration(value, what=what)}
    raise _shape_error(what, value)


def parse_retention(value: RetentionValue, *, what: str = "WEFT_RETENTION") -> dict[RunStatus, float | None]:
    """The period of each terminal status from ``WEFT_RETENTION``: ``None`` keeps every
    finished run, a duration applies to all, and a dict names statuses, with ``"default"``
    (itself :data:`DEFAULT_RETENTION` when left out) for the others.

    Raises :class:`ConfigurationError` or :class:`InvalidDuration` saying what to fix."""
    if value is None:
        return dict.fromkeys(RETAINED_STATUSES)
    if isinstance(value, Mapping):
        entries = _entries(value, what)
        fallback = entries.get(DEFAULT_KEY, parse_duration(DEFAULT_RETENTION))
        return {status: entries.get(status, fallback) for status in RETAINED_STATUSES}
    if isinstance(value, int | float | timedelta | str):
        return dict.fromkeys(RETAINED_STATUSES, parse_duration(value, what=what))
    raise _shape_error(what, value)


def apply_override(periods: Periods, override: Mapping[str, float | None]) -> dict[RunStatus, float | None]:
    """The periods of a workflow's runs: its own where it gives one (by status, then its
    ``"default"``), ``periods`` (the setting's) otherwise."""
    return {
        status: override[status]
        if status in override
        else override[DEFAULT_KEY]
        if DEFAULT_KEY in override
        else periods[status]
        for status in RETAINED_STATUSES
    }


@dataclass(frozen=True)
class DueRange:
    """Terminal runs of ``status`` last changed before ``cutoff``: only ``workflow``'s when
    it is set, else those of every workflow but the ``excluded`` ones."""

    status: RunStatus
    cutoff: datetime
    workflow: str | None = None
    excluded: tuple[str, ...] = ()


def due_ranges(
    periods: Periods, overrides: Mapping[str, Mapping[str, float | None]], now: datetime
) -> list[DueRange]:
    """The ranges of due runs at ``now``: per status, one range for every workflow that
    follows the setting, and one per workflow whose own period for that status differs
    (none for a period of ``None``). Each range is a single index range scan
    (``status``, ``updated_at``, or ``workflow_name``, ``status``, ``updated_at``).

    A workflow with its own period is excluded from the shared range even when its period
    is shorter: its own range deletes its runs first, so the shared scan does not meet
    them (and a kept run is not counted twice). One kept longer than the setting is met
    by the shared scan between the two cutoffs and skipped."""
    ranges = []
    for status in RETAINED_STATUSES:
        shared = periods[status]
        own = {
            name: period
            for name, override in sorted(overrides.items())
            if (period := apply_override(periods, override)[status]) != shared
        }
        if shared is not None:
            ranges.append(DueRange(status, now - timedelta(seconds=shared), excluded=tuple(own)))
        ranges.extend(
            DueRange(status, now - timedelta(seconds=period), workflow=name)
            for name, period in own.items()
            if period is not None
        )
    return ranges
