"""Reset: where a run's history may be cut so that a new run replays the entries before
the cut and continues live from there (``runtime.reset``).

Two checks, both before anything is written. :func:`check_cut` reads the history only:
the position exists, it does not fall among the handler applications recorded while the
workflow was blocked, and every entry kept has finished (a blocking operation's start is
never kept without its completion). :func:`replay_kept` re-executes the workflow function
read-only over the kept entries, with the new run's input and this process's code, and
refuses a cut the new run could not replay to: the code diverges from the history, the
cut falls inside a handler (between its application and its steps), or the workflow
raises before it gets past the kept entries (the new run would fail at once).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .context import WorkflowContext
from .errors import InvalidInput
from .records import ClaimedRun, RunStatus, StepKind, StepRecord, StepStatus
from .replay import run_body
from .unwind import ContinueAsNew, QueryFrontier

if TYPE_CHECKING:
    from .executor import Engine

FINISHED = frozenset({StepStatus.COMPLETED, StepStatus.FAILED})
"""The statuses of an entry a reset may keep: its outcome is recorded."""

BLOCKED_ENTRIES = frozenset({StepKind.HANDLER, StepKind.CANCEL_REQUEST})
"""Entries recorded while the workflow was blocked (between a blocking operation's start
and its completion): never the first position of a new run's live part."""


@dataclass(frozen=True)
class ResetLink:
    """One side of a reset, as stored on a run: on the new run, where it came from
    (``WorkflowRun.reset_from``); on the old one, what replaced it (``reset_to``)."""

    run_id: str
    """The other run."""
    seq: int
    """The position the history was cut at: the new run kept the entries before it."""
    reason: str
    reset_at: str
    """When (ISO 8601, the database clock)."""

    @classmethod
    def of(cls, stored: Any) -> ResetLink | None:
        if not isinstance(stored, dict) or not stored.get("run_id"):
            return None
        seq = stored.get("seq")
        return cls(
            run_id=str(stored["run_id"]),
            seq=seq if isinstance(seq, int) else 0,
            reason=str(stored.get("reason") or ""),
            reset_at=str(stored.get("reset_at") or ""),
        )

    def as_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "seq": self.seq, "reason": self.reason, "reset_at": self.reset_at}


@dataclass(frozen=True)
class ResetOutcome:
    """What a reset did."""

    run_id: str
    """The new run."""
    workflow_id: str
    workflow_name: str
    reset_from: str
    """The run it replaced."""
    to_seq: int
    """The new run kept the entries before this position of the old run's history."""
    previous_status: RunStatus
    """The old run's status before the reset."""
    closed: bool
    """The old run was active and the reset closed it (``cancelled``)."""


def _refuse(label: str, to_seq: Any, finding: str) -> InvalidInput:
    return InvalidInput(f"cannot reset {label} to position {to_seq}: {finding}", field="to_seq")


def check_cut(
    history: Mapping[int, StepRecord], to_seq: Any, *, label: str, now: datetime | None = None
) -> int:
    """``to_seq`` if the history can be cut there, else ``InvalidInput`` (``field`` is
    ``"to_seq"``) saying why and which positions would do. ``label`` names the run.
    ``now``: a sleep recorded as waiting whose time had come by then is over (its end,
    written with a later write, may not have been when the run stopped); the new run's
    replay ends it at once."""
    if isinstance(to_seq, bool) or not isinstance(to_seq, int):
        raise InvalidInput(
            f"to_seq must be a position in the run's history (an integer, 0 or more); got {to_seq!r}",
            field="to_seq",
        )
    length = max(history) + 1 if history else 0
    if to_seq < 0:
        raise _refuse(label, to_seq, "a position is 0 or more (0 replays nothing and starts the run over)")
    if to_seq > length:
        held = f"positions 0 to {length - 1}" if length else "no entries"
        raise _refuse(
            label,
            to_seq,
            f"it is past the end of the history ({held}); to_seq may be at most {length} "
            "(keep every entry and continue after the last)",
        )
    entry = history.get(to_seq)
    if entry is not None and entry.kind in BLOCKED_ENTRIES:
        handler = entry.kind == StepKind.HANDLER
        what = "a handler application" if handler else "a cancellation request received"
        raise _refuse(
            label,
            to_seq,
            f"position {to_seq} is {what} ({entry.name}) recorded while the workflow was blocked, "
            "after the blocking operation started and before it completed. Reset to the position "
            "of that blocking operation (it then runs again) or to a position after it completed",
        )
    for seq in range(to_seq):
        kept = history.get(seq)
        if kept is None:
            missing = f"position {seq} is missing from the history; reset to {seq} or earlier"
            raise _refuse(label, to_seq, missing)
        if kept.status not in FINISHED and not _sleep_over(kept, now):
            what = kept.kind if kept.name == kept.kind else f"{kept.kind} {kept.name}"
            raise _refuse(
                label,
                to_seq,
                f"position {seq} ({what}) is {kept.status}, not finished: the new run "
                "would keep its start without its completion. Reset to position "
                f"{seq} or earlier (it then runs again)",
            )
    return to_seq


def _sleep_over(entry: StepRecord, now: datetime | None) -> bool:
    if now is None or entry.kind != StepKind.SLEEP or entry.status != StepStatus.WAITING:
        return False
    fire_at = (entry.result or {}).get("fire_at")
    return isinstance(fire_at, str) and datetime.fromisoformat(fire_at) <= now


def replay_kept(engine: Engine, claimed: ClaimedRun, to_seq: int, *, label: str) -> None:
    """Replay ``claimed`` (the new run's input and the entries before ``to_seq``) read-only
    with this process's code; ``InvalidInput`` (``field`` ``"to_seq"``) if the new run
    could not replay to the cut. Runs no activity and writes nothing. Raises
    ``WorkflowNotRegistered`` if this process does not know the workflow."""
    workflow = engine.workflows.get_workflow(claimed.workflow_name)
    ctx = WorkflowContext(engine, claimed, engine.config(), workflow, read_only=True, due_sleeps_over=True)
    raised = run_body(workflow, ctx, claimed)
    fatal = ctx._fatal
    if fatal is not None:
        recorded = getattr(fatal, "recorded", None) or {}
        requested = getattr(fatal, "requested", None) or {}
        position = getattr(fatal, "position", to_seq)
        asked = f"{requested.get('kind')} {requested.get('name')!r}".strip()
        raise _refuse(
            label,
            to_seq,
            f"the entries before it do not replay with the current code and this input: at position "
            f"{position} the history records {recorded.get('kind')} {recorded.get('name')!r} but the "
            f"workflow now asks for {asked}. Reset to position {position} or earlier, or keep the code "
            "and input that recorded it",
        )
    unwinding = ctx._unwinding
    if isinstance(unwinding, QueryFrontier):
        if ctx._frontier_in_handler is not None:
            raise _refuse(
                label,
                to_seq,
                f"position {to_seq} falls inside the {ctx._frontier_in_handler}, between its application "
                "and the steps it took. Reset to the position of that handler application's blocking "
                "operation or to a position after the handler's steps",
            )
        return
    if raised is not None:
        raise _refuse(
            label,
            to_seq,
            f"replaying the entries before it, the workflow raises {type(raised).__name__}: {raised} "
            f"(at position {ctx._seq}), so the new run would fail at once without running anything "
            "again. Reset to a position before the step whose recorded outcome leads to this",
        )
    if ctx._seq < to_seq:
        ended = "continues as new" if isinstance(unwinding, ContinueAsNew) else "returns"
        raise _refuse(
            label,
            to_seq,
            f"replaying the entries before it, the workflow {ended} at position {ctx._seq}, so the "
            f"entries from {ctx._seq} on could not replay. Reset to position {ctx._seq} or earlier",
        )
