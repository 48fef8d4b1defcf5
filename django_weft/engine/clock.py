"""Where django_weft reads the time: the one seam a test harness moves.

On a deployment no clock is installed and nothing changes: the store asks the database
for "now" (``now()`` inside its statements on PostgreSQL, the process clock on SQLite)
and the engine measures the time that passes within a turn with ``time.monotonic()``.

A test harness (the ``weft`` pytest fixture of :mod:`django_weft.testing`) installs a
:class:`VirtualClock` for the length of one test. While it is installed, every "now" the
store computes, compares or writes is that clock's (bound as a parameter instead of the
database's ``now()``), the time the engine sees pass is the clock's, and a retry delay
slept inside a turn moves the clock instead of the thread. The clock stands still
unless something moves it.

The installed clock belongs to the process: parallel test workers (pytest-xdist) are
processes, each with its own.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta


class VirtualClock:
    """A clock that moves only when told to. Thread-safe."""

    def __init__(self, start: datetime | None = None) -> None:
        if start is None:
            start = datetime.now(UTC)
        if start.tzinfo is None:
            raise ValueError(f"a virtual clock starts at a timezone-aware datetime; got {start.isoformat()}")
        self._start = start.astimezone(UTC)
        self._now = self._start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        """The clock's current time (UTC)."""
        return self._now

    def elapsed(self) -> float:
        """Seconds since the clock started (what it reads as a monotonic clock)."""
        return (self._now - self._start).total_seconds()

    def advance(self, seconds: float) -> datetime:
        """Move the clock ``seconds`` forward; returns the new time."""
        if seconds < 0:
            raise ValueError(f"a virtual clock only moves forward; got {seconds} seconds")
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now

    def advance_to(self, moment: datetime) -> datetime:
        """Move the clock to ``moment`` if that is later than now; returns the new time."""
        if moment.tzinfo is None:
            raise ValueError(f"advance_to() takes a timezone-aware datetime; got {moment.isoformat()}")
        with self._lock:
            self._now = max(self._now, moment.astimezone(UTC))
            return self._now

    def __repr__(self) -> str:
        return f"<VirtualClock at {self._now.isoformat()}>"


_installed: VirtualClock | None = None


def installed() -> VirtualClock | None:
    """The virtual clock in use, or ``None`` (a deployment: real time)."""
    return _installed


def install(clock: VirtualClock) -> None:
    """Make ``clock`` the process's clock until :func:`uninstall`. Refuses to replace
    another virtual clock: two harnesses in one test would each move the other's time."""
    global _installed
    if _installed is not None and _installed is not clock:
        raise RuntimeError(
            f"a virtual clock is installed already ({_installed!r}); uninstall it first "
            "(one weft fixture per test)"
        )
    _installed = clock


def uninstall(clock: VirtualClock | None = None) -> None:
    """Go back to real time (if ``clock`` is given, only if it is the one installed)."""
    global _installed
    if clock is None or _installed is clock:
        _installed = None


def monotonic() -> float:
    """Seconds from an arbitrary origin: ``time.monotonic()``, or the virtual clock's
    elapsed time. Only differences between two readings mean anything."""
    virtual = _installed
    return time.monotonic() if virtual is None else virtual.elapsed()


def sleep(seconds: float) -> None:
    """Wait ``seconds``: the thread sleeps, or the virtual clock moves forward at once."""
    virtual = _installed
    if virtual is None:
        time.sleep(seconds)
    else:
        virtual.advance(seconds)
