"""Moved to :mod:`django_weft.runtime.heartbeat`; kept importable for existing imports."""

from __future__ import annotations

from .runtime.heartbeat import (
    Attempt,
    Heartbeat,
    ensure_heartbeat,
    running_attempt,
    running_attempts,
    stop_heartbeat,
)

__all__ = [
    "Attempt",
    "Heartbeat",
    "ensure_heartbeat",
    "running_attempt",
    "running_attempts",
    "stop_heartbeat",
]
