"""The one service path: start, message, change, run and read runs.

The Python client, management commands, Celery tasks, admin actions and API views all
call these functions; the runtime writes no rows itself (the store does). One module per
concern: :mod:`.process` (this process's engine and store, the on-commit doorbell),
:mod:`.starts`, :mod:`.messages` (signals, updates, queries), :mod:`.lifecycle` (cancel,
suspend, resume, retry, reset), :mod:`.worker` (turns, queued activities, finalizers),
:mod:`.sweep` (``tick``), :mod:`.retention` (``purge_expired``), :mod:`.schedules`,
:mod:`.reading`, :mod:`.bulk` (a lifecycle operation on many runs), :mod:`.bulk_jobs`
(the same on every run a filter matches, by the tick; :mod:`.run_sources` names where a
job finds its runs), :mod:`.schedule_bulk` (an operation on many schedules),
:mod:`.operations` (every operation described once), :mod:`.histories` (history
exports), :mod:`.replay` (checking stored histories against the code) and :mod:`.workers`
(what each worker can run); and :mod:`.dispatch`, :mod:`.heartbeat`, :mod:`.validation`.
"""

from __future__ import annotations

from .bulk import BulkFailure, BulkOutcome, BulkRun, apply_bulk, count_runs, refusal_for
from .bulk_jobs import BulkJobRecord, get_bulk_job, process_bulk_jobs, start_bulk_job
from .dispatch import delivers, get_dispatcher
from .histories import (
    HISTORY_FORMAT,
    HISTORY_VERSION,
    ParsedHistory,
    RunSelection,
    export_history,
    history_files,
    load_history_file,
    parse_history,
    stored_documents,
)
from .inprocess import InProcessWorker
from .lifecycle import ResetOutcome, cancel, reset, resume, retry, suspend
from .messages import HandlerInfo, SignalAccepted, query, registered_handlers, signal, update, update_result
from .process import CurrentDispatcher, dispatch_on_commit, get_engine, get_store
from .reading import (
    FinishedPerMinute,
    Latest,
    StatusReport,
    describe,
    finished_per_minute,
    get_run,
    history,
    read_history,
    read_run,
    read_signals,
    read_steps_at,
    read_timers,
    read_updates,
    result_of,
    status_report,
)
from .records import HistoryEntry, RunRecord, SignalRecord, TimerRecord, UpdateRecord
from .replay import ReplaySummary, RunReplay, replay_document, replay_files, replay_parsed, replay_runs
from .retention import GcBatch, GcReport, purge_expired
from .run_sources import register_run_source
from .schedule_bulk import ScheduleBulkOutcome, apply_schedule_bulk, schedule_refusal_for
from .schedules import (
    ScheduleDescription,
    SyncReport,
    backfill_schedule,
    create_schedule,
    declared_schedules,
    delete_schedule,
    describe_schedule,
    describe_schedules,
    fire_due_schedules,
    list_schedules,
    pause_schedule,
    sync_schedules,
    trigger_schedule,
    unpause_schedule,
    update_schedule,
)
from .starts import (
    ON_CONFLICT_CHOICES,
    RELATED_OBJECT_ATTRIBUTE,
    SignalWithStartResult,
    StartOptions,
    StartResult,
    signal_with_start,
    start,
    start_with,
)
from .sweep import TickReport, tick
from .worker import ActivityOutcome, dispatch_finalizer, run_activity, run_finalizer, run_turn
from .workers import StrandedWorkflow, WorkerCoverage, WorkerRecord, worker_coverage

__all__ = [
    "HISTORY_FORMAT",
    "HISTORY_VERSION",
    "ON_CONFLICT_CHOICES",
    "RELATED_OBJECT_ATTRIBUTE",
    "ActivityOutcome",
    "BulkFailure",
    "BulkJobRecord",
    "BulkOutcome",
    "BulkRun",
    "CurrentDispatcher",
    "FinishedPerMinute",
    "GcBatch",
    "GcReport",
    "HandlerInfo",
    "HistoryEntry",
    "InProcessWorker",
    "Latest",
    "ParsedHistory",
    "ReplaySummary",
    "ResetOutcome",
    "RunRecord",
    "RunReplay",
    "RunSelection",
    "ScheduleBulkOutcome",
    "ScheduleDescription",
    "SignalAccepted",
    "SignalRecord",
    "SignalWithStartResult",
    "StartOptions",
    "StartResult",
    "StatusReport",
    "StrandedWorkflow",
    "SyncReport",
    "TickReport",
    "TimerRecord",
    "UpdateRecord",
    "WorkerCoverage",
    "WorkerRecord",
    "apply_bulk",
    "apply_schedule_bulk",
    "backfill_schedule",
    "cancel",
    "count_runs",
    "create_schedule",
    "declared_schedules",
    "delete_schedule",
    "delivers",
    "describe",
    "describe_schedule",
    "describe_schedules",
    "dispatch_finalizer",
    "dispatch_on_commit",
    "export_history",
    "finished_per_minute",
    "fire_due_schedules",
    "get_bulk_job",
    "get_dispatcher",
    "get_engine",
    "get_run",
    "get_store",
    "history",
    "history_files",
    "list_schedules",
    "load_history_file",
    "parse_history",
    "pause_schedule",
    "process_bulk_jobs",
    "purge_expired",
    "query",
    "read_history",
    "read_run",
    "read_signals",
    "read_steps_at",
    "read_timers",
    "read_updates",
    "refusal_for",
    "register_run_source",
    "registered_handlers",
    "replay_document",
    "replay_files",
    "replay_parsed",
    "replay_runs",
    "reset",
    "result_of",
    "resume",
    "retry",
    "run_activity",
    "run_finalizer",
    "run_turn",
    "schedule_refusal_for",
    "signal",
    "signal_with_start",
    "start",
    "start_bulk_job",
    "start_with",
    "status_report",
    "stored_documents",
    "suspend",
    "sync_schedules",
    "tick",
    "trigger_schedule",
    "unpause_schedule",
    "update",
    "update_result",
    "update_schedule",
    "worker_coverage",
]
