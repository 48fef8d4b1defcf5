"""The schedules' admin: the list and a schedule's page (:mod:`.admin`, :mod:`.display`), the
actions (:mod:`.actions`), the add and change form (:mod:`.forms`) and the Backfill tool
(:mod:`.backfill`)."""

from __future__ import annotations

from .admin import ScheduleAdmin

__all__ = ["ScheduleAdmin"]
