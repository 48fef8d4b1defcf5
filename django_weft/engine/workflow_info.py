"""What a workflow knows about its run (``ctx.info``) and its logger (``ctx.logger``), which
is silent while the run replays recorded history."""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import WorkflowContext


@dataclass(frozen=True)
class WorkflowInfo:
    run_id: str
    workflow_id: str
    workflow_name: str
    attempt: int
    started_at: datetime
    schedule_id: str | None = None
    """The schedule that started this run, if one did."""
    scheduled_at: datetime | None = None
    """The time the schedule fired this run for (UTC; before any jitter or catch-up delay)."""
    search_attributes: Mapping[str, Any] = field(default_factory=dict)
    """The run's search attributes as they were when this turn claimed it (those the
    workflow sets in the turn are not added here)."""
    priority: int = 0
    """The run's priority (-100..100, higher first; docs/how-to/flow-control.md)."""


def schedule_info(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """``schedule_id`` and ``scheduled_at`` from a scheduled run's start attributes."""
    schedule_id, moment = attributes.get("weft_schedule_id"), attributes.get("weft_scheduled_at")
    if not isinstance(schedule_id, str) or not isinstance(moment, str):
        return {}
    try:
        return {"schedule_id": schedule_id, "scheduled_at": datetime.fromisoformat(moment)}
    except ValueError:
        return {}


class ReplayAwareLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger that says nothing while the workflow replays recorded history, so a line
    is written once however many turns replay it. Its records carry ``run_id``,
    ``workflow_id``, ``workflow``, ``seq`` (the position reached) and ``attempt`` (the
    run's) in ``extra``."""

    def __init__(self, logger: logging.Logger, ctx: WorkflowContext) -> None:
        super().__init__(logger, {})
        self._ctx = ctx

    def isEnabledFor(self, level: int) -> bool:
        return not self._ctx.is_replaying and self.logger.isEnabledFor(level)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        info = self._ctx.info
        kwargs["extra"] = {
            "run_id": info.run_id,
            "workflow_id": info.workflow_id,
            "workflow": info.workflow_name,
            # The position the workflow has reached (its next durable operation's).
            "seq": self._ctx._seq,
            "attempt": info.attempt,
            # The names of the first releases, kept for the formatters that read them.
            "weft_run_id": info.run_id,
            "weft_workflow_id": info.workflow_id,
            **(kwargs.get("extra") or {}),
        }
        return f"[{info.workflow_name} {info.workflow_id}] {msg}", kwargs
