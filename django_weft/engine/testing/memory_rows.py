"""The rows of the in-memory store (:mod:`.memory_store`): a run with its steps, timers and
pending cancellation, and a message (a signal or an update)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .. import codec
from ..records import CancelRequest, RunStatus, StepRecord, StepWrite, TimerWrite


@dataclass
class MemoryRun:
    run_id: str
    workflow_id: str
    workflow_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    created_at: datetime
    status: str = RunStatus.RUNNING
    owner: str | None = None
    epoch: int = 0
    lease_expires_at: datetime | None = None
    attempt: int = 1
    waiting_on: dict[str, Any] | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    failure_category: str = ""
    finalizer_state: Any = None
    search_attributes: dict[str, Any] = field(default_factory=dict)
    parent_run_id: str | None = None
    parent_seq: int | None = None
    parent_close_policy: str = "terminate"
    steps: dict[int, StepWrite] = field(default_factory=dict)
    timers: dict[tuple[int, str], TimerWrite] = field(default_factory=dict)
    cancel_request: CancelRequest | None = None


@dataclass
class MemoryMessage:
    """A signal (``consumed_seq``) or an update (``applied_seq``, ``status``, outcome)."""

    kind: str
    pk: int
    run_id: str
    name: str
    payload: Any
    update_id: str | None = None
    consumed_seq: int | None = None
    applied_seq: int | None = None
    status: str = "accepted"
    result: Any = None
    error: dict[str, Any] | None = None


def step_record(step: StepWrite) -> StepRecord:
    """The step as the engine reads it back from a claim or a history."""
    return StepRecord(
        seq=step.seq,
        kind=step.kind,
        name=step.name,
        status=step.status,
        args_json=step.args_json,
        result=codec.loads(step.result_json) if step.result_json is not None else None,
        error=codec.loads(step.error_json) if step.error_json is not None else None,
        attempt=step.attempt,
        started_at=step.started_at,
        finished_at=step.finished_at,
        failed_attempts=tuple(codec.loads(step.failed_attempts_json)) if step.failed_attempts_json else (),
    )
