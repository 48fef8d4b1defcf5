from __future__ import annotations

from .bulk import BulkJob
from .messages import Signal, Update, UpdateStatus
from .runs import WorkflowRun
from .schedules import Schedule
from .steps import Step
from .timers import Timer
from .workers import Worker

__all__ = [
    "BulkJob",
    "Schedule",
    "Signal",
    "Step",
    "Timer",
    "Update",
    "UpdateStatus",
    "Worker",
    "WorkflowRun",
]
