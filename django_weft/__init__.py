"""django_weft: durable workflows for Django.

Importable before ``django.setup()``: only the framework-free engine is imported here;
``client`` is loaded on first use.
"""

from __future__ import annotations

from typing import Any

from .engine.context import ActivityInfo, WorkflowContext, WorkflowInfo, activity_info
from .engine.declared_schedules import schedule
from .engine.durations import parse_duration
from .engine.errors import (
    ActivityFailed,
    CancellationRequested,
    ChildWorkflowFailed,
    ConcurrencyLimited,
    ConfigurationError,
    Deposed,
    DuplicateRegistration,
    InvalidDuration,
    InvalidInput,
    NonDeterminismError,
    PayloadError,
    QueryFailed,
    ResultTimeout,
    ScheduleAlreadyExists,
    ScheduleManaged,
    ScheduleNotFound,
    SignalTimeout,
    UnknownHandler,
    UpdateFailed,
    UpdateNotFound,
    UpdateTimeout,
    UpdateValidationError,
    WeftError,
    WorkflowAlreadyExists,
    WorkflowArgumentsError,
    WorkflowCancelled,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowNotRegistered,
    WorkflowTerminalError,
    WorkflowTimedOut,
)
from .engine.flow import Concurrency, Debounce, RateLimit
from .engine.registry import Activity, Workflow, activity, workflow
from .engine.retry import RetryPolicy
from .engine.schedule_firing import OverlapPolicy
from .engine.schedule_spec import InvalidSchedule, ScheduleSpec

__version__ = "0.1.0.dev0"

__all__ = [
    "Activity",
    "ActivityFailed",
    "ActivityInfo",
    "CancellationRequested",
    "ChildWorkflowFailed",
    "Concurrency",
    "ConcurrencyLimited",
    "ConfigurationError",
    "Debounce",
    "Deposed",
    "DuplicateRegistration",
    "InvalidDuration",
    "InvalidInput",
    "InvalidSchedule",
    "NonDeterminismError",
    "OverlapPolicy",
    "PayloadError",
    "QueryFailed",
    "RateLimit",
    "ResultTimeout",
    "RetryPolicy",
    "ScheduleAlreadyExists",
    "ScheduleManaged",
    "ScheduleNotFound",
    "ScheduleSpec",
    "SignalTimeout",
    "UnknownHandler",
    "UpdateFailed",
    "UpdateNotFound",
    "UpdateTimeout",
    "UpdateValidationError",
    "WeftError",
    "Workflow",
    "WorkflowAlreadyExists",
    "WorkflowArgumentsError",
    "WorkflowCancelled",
    "WorkflowContext",
    "WorkflowFailed",
    "WorkflowInfo",
    "WorkflowNotFound",
    "WorkflowNotRegistered",
    "WorkflowTerminalError",
    "WorkflowTimedOut",
    "activity",
    "activity_info",
    "client",
    "parse_duration",
    "schedule",
    "workflow",
]


def __getattr__(name: str) -> Any:
    if name == "client":
        import importlib

        return importlib.import_module(f"{__name__}.client")
    raise AttributeError(f"module 'django_weft' has no attribute {name!r}")
