"""REST views: parse, call the runtime, shape. No rows are written here.

One module per resource: :mod:`.runs`, :mod:`.bulk` (the bulk routes of ``runs/``),
:mod:`.schedules`, :mod:`.workflows`; :mod:`.common` holds what they share.
"""

from __future__ import annotations

from .runs import RunViewSet
from .schedules import ScheduleViewSet
from .workflows import WorkflowListView

__all__ = ["RunViewSet", "ScheduleViewSet", "WorkflowListView"]
