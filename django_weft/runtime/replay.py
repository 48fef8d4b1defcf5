"""Replaying stored histories against the current code, to check a deploy before it
ships (``manage.py weft_replay``, :mod:`django_weft.testing.replay`).

Each history, read from the database or from an export file, is turned into the document
of :mod:`.histories` and replayed by :func:`django_weft.engine.replay.replay_history`,
whose engine has no store to write to and no broker to send to: replaying writes
nothing, runs no activity and rings no doorbell.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..conf import weft_settings
from ..engine.records import TERMINAL_STATUSES, FailureCategory, RunStatus
from ..engine.registry import Registry, registry
from ..engine.replay import ReplayEnd, ReplayResult, ReplayVerdict, replay_history
from .histories import (
    DEFAULT_BATCH,
    ParsedHistory,
    RunSelection,
    history_files,
    load_history_file,
    parse_history,
    stored_documents,
)


@dataclass(frozen=True)
class RunReplay:
    """How one run's history replayed, with what a report shows about the run."""

    run_id: str
    workflow_id: str
    workflow: str
    status: str
    failure_category: str | None
    source: str
    """``"database"``, or the file the history was read from."""
    result: ReplayResult
    held_at: int | None = None
    """The position of the non-determinism the run already failed with, if it did."""

    @property
    def verdict(self) -> ReplayVerdict:
        return self.result.verdict

    @property
    def live(self) -> bool:
        """Whether the run may still execute (not in a terminal status)."""
        return self.status not in TERMINAL_STATUSES

    @property
    def fails_check(self) -> bool:
        """A divergence, or a live run whose workflow this code does not register (it could
        never go on). A finished run of a removed workflow does not fail the check."""
        if self.verdict == ReplayVerdict.DIVERGED:
            return True
        return self.verdict == ReplayVerdict.MISSING_WORKFLOW and self.live

    def line(self) -> str:
        """One line for a report: the verdict, the run id, the workflow, the workflow id
        (when it is not the run id), the status, and what the replay found."""
        label = {ReplayVerdict.OK: "OK", ReplayVerdict.DIVERGED: "DIVERGED"}.get(self.verdict, "MISSING")
        status = self.status
        if self.status == RunStatus.FAILED and self.failure_category:
            status = f"{status}, {self.failure_category}"  # e.g. "failed, nondeterminism"
        workflow_id = f" {self.workflow_id}" if self.workflow_id != self.run_id else ""
        head = f"{label:<8} {self.run_id} {self.workflow}{workflow_id} [{status}]"
        return f"{head}: {self.finding()}"

    def finding(self) -> str:
        result = self.result
        if result.verdict == ReplayVerdict.MISSING_WORKFLOW:
            consequence = (
                "the run could not go on after this deploy"
                if self.live
                else "the run has finished, so this is not counted as a failure"
            )
            return f"{result.detail}; {consequence}"
        if result.divergence is not None:
            divergence = result.divergence
            text = (
                f"at position {divergence.position} the history records {_operation(divergence.recorded)}, "
                f"the code asks for {_operation(divergence.requested)}"
            )
            if self.held_at is not None:
                text += " (the run already failed for non-determinism)"
            return text
        text = f"{result.replayed} of {result.history_length} positions replayed, {_ending(result)}"
        if self.held_at is not None:
            text += (
                f"; it failed for non-determinism at position {self.held_at} before, and this code "
                "replays it: retry it once this code is deployed"
            )
        return text

    def as_dict(self) -> dict[str, Any]:
        """The report of this run as JSON values (``weft_replay --format json``)."""
        result = self.result
        divergence = result.divergence
        return {
            "run_id": self.run_id,
            "workflow_id": self.workflow_id,
            "workflow": self.workflow,
            "status": self.status,
            "failure_category": self.failure_category,
            "source": self.source,
            "verdict": str(result.verdict),
            "fails_check": self.fails_check,
            "end": str(result.end),
            "replayed": result.replayed,
            "history_length": result.history_length,
            "detail": result.detail or None,
            "held_at": self.held_at,
            "divergence": None
            if divergence is None
            else {
                "position": divergence.position,
                "recorded": divergence.recorded,
                "requested": divergence.requested,
                "message": divergence.message,
            },
        }


def _operation(described: dict[str, Any]) -> str:
    kind, name = described.get("kind"), described.get("name")
    if kind == "finish":
        return "the workflow to return"
    if kind == "raise":
        return f"the workflow to raise {name}"
    if kind == "handler" and not name:
        return "no handler application"
    if kind is not None and name is not None:
        return f"{kind} {name!r}"
    return json.dumps(described, sort_keys=True, default=str) if described else "nothing"


def _ending(result: ReplayResult) -> str:
    if result.end == ReplayEnd.END_OF_HISTORY:
        return "then the run goes on past its history"
    if result.end == ReplayEnd.RETURNED:
        return "then the workflow returns"
    if result.end == ReplayEnd.CONTINUED:
        return "then the workflow continues as new"
    return f"then the workflow raises {result.detail}"


@dataclass
class ReplaySummary:
    """Counts over a replay of many runs."""

    total: int = 0
    ok: int = 0
    diverged: int = 0
    missing: int = 0
    failing: int = 0
    """Runs that fail the check (:attr:`RunReplay.fails_check`)."""

    def add(self, replay: RunReplay) -> None:
        self.total += 1
        if replay.verdict == ReplayVerdict.OK:
            self.ok += 1
        elif replay.verdict == ReplayVerdict.DIVERGED:
            self.diverged += 1
        else:
            self.missing += 1
        if replay.fails_check:
            self.failing += 1

    @property
    def failed(self) -> bool:
        return self.failing > 0

    def line(self) -> str:
        runs = "run" if self.total == 1 else "runs"
        return (
            f"replayed {self.total} {runs}: {self.ok} ok, {self.diverged} diverged, "
            f"{self.missing} missing workflow"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "runs": self.total,
            "ok": self.ok,
            "diverged": self.diverged,
            "missing_workflow": self.missing,
            "failing": self.failing,
            "passed": not self.failed,
        }


def replay_parsed(
    history: ParsedHistory, *, workflows: Registry = registry, now: datetime | None = None
) -> RunReplay:
    """Replay one checked history against the workflows registered in ``workflows``."""
    moment = now or datetime.now(UTC)
    result = replay_history(
        history.claimed(moment), workflows=workflows, config=weft_settings.engine_config()
    )
    held_at = None
    if history.failure_category == FailureCategory.NONDETERMINISM and isinstance(history.error, dict):
        position = history.error.get("position")
        held_at = position if isinstance(position, int) else None
    return RunReplay(
        run_id=history.run_id,
        workflow_id=history.workflow_id,
        workflow=history.workflow_name,
        status=history.status,
        failure_category=history.failure_category,
        source=history.source,
        result=result,
        held_at=held_at,
    )


def replay_document(
    document: Any, *, source: str = "the history document", workflows: Registry = registry
) -> RunReplay:
    """Replay one history document (an export's content); ``InvalidInput`` if it is not one."""
    return replay_parsed(parse_history(document, source=source), workflows=workflows)


def replay_runs(
    selection: RunSelection, *, batch: int = DEFAULT_BATCH, workflows: Registry = registry
) -> Iterator[RunReplay]:
    """Replay the stored runs ``selection`` picks, newest first, one at a time, reading
    them in keyset batches (see :func:`.histories.stored_documents`). Reads only."""
    now = datetime.now(UTC)
    for document in stored_documents(selection, batch=batch):
        yield replay_parsed(parse_history(document, source="database"), workflows=workflows, now=now)


def replay_files(paths: Iterable[str | Path], *, workflows: Registry = registry) -> Iterator[RunReplay]:
    """Replay the history files at ``paths`` (files, or directories of ``*.json`` files),
    in order. Each path is checked before anything is replayed; a file that is not a
    history document raises ``InvalidInput`` naming it when its turn comes."""
    files = [file for path in paths for file in history_files(path)]
    now = datetime.now(UTC)
    for file in files:
        document = load_history_file(file)
        yield replay_parsed(parse_history(document, source=str(file)), workflows=workflows, now=now)
