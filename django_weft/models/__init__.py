from __future__ import annotations

from .bulk import BulkJob
from .flow import ActivitySlot, RateLimitBucket
from .messages import Signal, Update, UpdateStatus
from .runs import WorkflowRun
from .schedules import Schedule
from .steps import Step
from .timers import Timer
from .workers import Worker

__all__ = [
    "ActivitySlot",
    "BulkJob",
    "RateLimitBucket",
    "Schedule",
    "Signal",
    "Step",
    "Timer",
    "Update",
    "UpdateStatus",
    "Worker",
    "WorkflowRun",
]
