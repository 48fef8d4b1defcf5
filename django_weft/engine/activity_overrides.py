"""Activity overrides: a test replaces what an activity does, by name.

:func:`~django_weft.engine.attempt.call_activity`, the one path every attempt takes
(inline in a turn, queued on a worker, an atomic one inside its transaction), calls
:func:`body_of` for the function to run. Nothing is overridden unless a test says so
(the ``weft`` fixture's ``mock_activity``), and everything around the call stays as it
is: the attempt is recorded under the activity's name like a real one, its failure goes
through the activity's retry policy, and replay returns the recorded result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .registry import Activity

_lock = threading.Lock()
_overrides: dict[str, Callable[..., Any]] = {}


def override(name: str, body: Callable[..., Any]) -> None:
    """Run ``body`` (called with the activity's arguments) instead of activity ``name``,
    in this process, until :func:`remove` or :func:`clear`."""
    with _lock:
        _overrides[name] = body


def remove(name: str) -> None:
    with _lock:
        _overrides.pop(name, None)


def clear() -> None:
    with _lock:
        _overrides.clear()


def body_of(act: Activity[..., Any]) -> Callable[..., Any]:
    """What an attempt of ``act`` calls: its override if a test set one, else its function.
    An activity that marks its attempts (a task's) calls its function always, which asks
    :func:`override_of` itself: what it records around the call stays."""
    if not _overrides or act.marks_attempts:  # the common case: one truthiness test
        return act.fn
    return _overrides.get(act.name, act.fn)


def override_of(name: str) -> Callable[..., Any] | None:
    """The override a test set for activity ``name``, if any."""
    return _overrides.get(name) if _overrides else None
