"""Named fault-injection points.

The engine calls :func:`hit` at a few named places (``before_step_commit``,
``after_activity``...). They do nothing unless a test arms them, either in-process with
:func:`arm` or in a child process through the ``WEFT_FAULTS`` environment variable:

    WEFT_FAULTS="before_step_commit:kill:3"   # SIGKILL this process the 3rd time it is hit
    WEFT_FAULTS="after_activity:sleep=5"      # sleep 5 s every time

Several entries are separated by commas. Actions: ``kill`` (SIGKILL), ``raise``
(:class:`InjectedFault`), ``sleep=<seconds>``. An optional third field is the hit number
on which to act (counting from 1); without it the action happens on every hit.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

POINTS = frozenset(
    {
        "after_claim",
        "before_step_commit",
        "after_step_commit",
        "after_activity",
        "atomic_before_commit",
        "before_park",
        "before_complete",
        "before_update_apply",
        "before_update_answer",
        "before_cancel_delivery",
        "before_finalizer_finish",
        "schedule_before_advance",
        "before_reset_commit",
    }
)

FaultAction = Callable[[dict[str, Any]], None]


class InjectedFault(Exception):
    """Raised by a point armed with the ``raise`` action."""


@dataclass
class _Armed:
    action: FaultAction
    on_hit: int | None
    hits: int = 0


_lock = threading.Lock()
_armed: dict[str, _Armed] = {}
_env_loaded = False


def arm(point: str, action: FaultAction | str, *, on_hit: int | None = None) -> None:
    """Arm ``point`` with a callable (receiving the hit's context) or an action string."""
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}; known: {', '.join(sorted(POINTS))}")
    with _lock:
        _armed[point] = _Armed(_parse_action(action) if isinstance(action, str) else action, on_hit)


def disarm(point: str | None = None) -> None:
    """Disarm one point, or all of them."""
    with _lock:
        if point is None:
            _armed.clear()
        else:
            _armed.pop(point, None)


def hit(point: str, **context: Any) -> None:
    """Called by the engine at ``point``; a no-op unless armed."""
    if not _env_loaded:
        _load_env()
    if not _armed:
        return
    with _lock:
        armed = _armed.get(point)
        if armed is None:
            return
        armed.hits += 1
        due = armed.on_hit is None or armed.hits == armed.on_hit
    if due:
        context["point"] = point
        armed.action(context)


def _load_env() -> None:
    global _env_loaded
    with _lock:
        if _env_loaded:
            return
        _env_loaded = True
        spec = os.environ.get("WEFT_FAULTS", "").strip()
    if not spec:
        return
    for entry in spec.split(","):
        fields = entry.strip().split(":")
        if len(fields) < 2:
            raise ValueError(f"WEFT_FAULTS entry {entry!r} must be point:action[:hit]")
        arm(fields[0], fields[1], on_hit=int(fields[2]) if len(fields) > 2 else None)


def _parse_action(action: str) -> FaultAction:
    if action == "kill":
        return lambda _context: os.kill(os.getpid(), signal.SIGKILL)
    if action == "raise":

        def _raise(context: dict[str, Any]) -> None:
            raise InjectedFault(f"fault injected at {context['point']}")

        return _raise
    if action.startswith("sleep="):
        seconds = float(action.split("=", 1)[1])
        return lambda _context: time.sleep(seconds)
    raise ValueError(f"unknown fault action {action!r}; use kill, raise or sleep=<seconds>")
