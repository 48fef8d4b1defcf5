"""Checking a stored history against the current workflow code (``manage.py weft_replay``).

:func:`replay_history` re-executes a run's workflow function over its recorded steps, as
a turn would, and reports whether the code still goes through the recorded history: the
first position where it asks for something else, or "ok". It never executes anything the
history does not record: an operation without a recorded outcome ends the replay there
("ok so far"), so no activity runs, no side-effect function is called, no child starts.

The replay is read-only by construction, not by care: its engine is given a
:class:`HistoryOnlyStore`, which holds no rows and refuses every write, and a
:class:`RefusingDispatcher`, which sends nothing. It has no database connection and no
broker to write to, whatever the workflow code asks for.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

from .attempt import describe_exception
from .context import WorkflowContext
from .errors import NonDeterminismError, WeftError, WorkflowNotRegistered, nondeterminism_error
from .executor import Engine, EngineConfig
from .records import ChildOutcome, ClaimedRun, PendingMessage
from .registry import Registry, registry
from .unwind import ContinueAsNew, QueryFrontier, Unwind


class ReplayVerdict(enum.StrEnum):
    OK = "ok"
    """The code goes through every recorded position it reached as the history records."""
    DIVERGED = "diverged"
    """The code asks for something else than the history records (see :class:`Divergence`)."""
    MISSING_WORKFLOW = "missing_workflow"
    """No workflow of the run's name is registered in this code: nothing was replayed."""


class ReplayEnd(enum.StrEnum):
    """Where an ``ok`` replay stopped."""

    END_OF_HISTORY = "end_of_history"
    """At an operation without a recorded outcome: the run would execute it next."""
    RETURNED = "returned"
    """The workflow function returned, after the whole history."""
    RAISED = "raised"
    """The workflow function raised, after the whole history (a run that failed)."""
    CONTINUED = "continued_as_new"
    """The workflow called ``ctx.continue_as_new``, after the whole history."""
    DIVERGED = "diverged"
    """At the divergence (the replay of a ``diverged`` verdict)."""
    NOT_RUN = "not_run"
    """Nothing was replayed (the workflow is not registered)."""


@dataclass(frozen=True)
class Divergence:
    """The first position where the code and the history disagree, in the terms of the
    :class:`NonDeterminismError` the engine would hold the run with."""

    position: int
    recorded: dict[str, Any]
    """What the history records there (``kind`` and ``name``; ``{}`` if nothing)."""
    requested: dict[str, Any]
    """What the code asks for there: an operation's ``kind`` and ``name``; ``kind``
    ``"handler"`` for a handler application it has no handler for; ``"finish"`` when the
    function returned and ``"raise"`` (``name``: the exception type) when it raised before
    the end of the history."""
    message: str


@dataclass(frozen=True)
class ReplayResult:
    """How one history replayed against the current code."""

    verdict: ReplayVerdict
    end: ReplayEnd
    replayed: int
    """Recorded positions the code went through as recorded (``history_length`` once it
    reached the end; the divergence's position for a divergence)."""
    history_length: int
    divergence: Divergence | None = None
    detail: str = ""
    """What the function raised (``RAISED``), or why nothing was replayed."""


class ReplayWriteRefused(WeftError):
    """A replay tried to write or dispatch (a bug: the read-only context stops first)."""


class HistoryOnlyStore:
    """The engine's store port for a replay: it holds no rows, answers the few reads a
    read-only context makes as if nothing had happened since the history was read (no
    pending messages, no finished child, no cancellation), and refuses every write.

    Every refused call is listed in :attr:`refused` as well as raised, because the engine
    turns some store failures into log lines; :func:`replay_history` fails loudly on any."""

    def __init__(self, now: datetime) -> None:
        self._now = now
        self.refused: list[str] = []

    def _refuse(self, operation: str) -> NoReturn:
        self.refused.append(operation)
        raise ReplayWriteRefused(f"a replay may not write, but the engine asked to {operation}")

    # -- reads ----------------------------------------------------------------------------

    def db_now(self) -> datetime:
        return self._now

    def pending_messages(self, run_id: str) -> list[PendingMessage]:
        return []

    def child_outcome(self, run_id: str, seq: int) -> ChildOutcome | None:
        return None  # a child whose outcome is not recorded is still running, for a replay

    def cancellation_requested(self, run_id: str, seq: int) -> str | None:
        return None

    def claim(self, *args: Any, **kwargs: Any) -> None:
        return None

    # -- writes: refused --------------------------------------------------------------------

    def commit_step(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("record a step")

    def commit_step_atomic(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("run an atomic activity")

    def park(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("park the run")

    def schedule_activity(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("schedule a queued activity")

    def finish_wait(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("finish a wait")

    def apply_update(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("apply an update")

    def answer_update(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("answer an update")

    def fail_update(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("fail an update")

    def deliver_cancel_request(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("deliver a cancellation request")

    def complete(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("complete the run")

    def fail(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("fail the run")

    def finish_cancelled(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("cancel the run")

    def start_child(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("start a child workflow")

    def close_children(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("close the run's children")

    def hand_on_slot(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("hand on the run's concurrency slot")

    def take_rate_limit(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("take a rate limit moment")

    def take_activity_slot(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("take an activity concurrency slot")

    def release_activity_slot(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("give back an activity concurrency slot")

    def renew_activity_slots(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("renew activity concurrency slots")

    def set_finalizer_state(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("set the finalizer state")

    def set_search_attributes(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("set search attributes")

    def continue_as_new(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("continue the run as new")

    def release(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("release the run")

    def renew(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("renew leases")


class RefusingDispatcher:
    """The dispatcher of a replay: it rings no doorbell (the engine logs and swallows a
    dispatch failure, so refusals are also listed in :attr:`refused`)."""

    def __init__(self) -> None:
        self.refused: list[str] = []

    def dispatch_turn(self, run_id: str, *, eta: datetime | None = None) -> NoReturn:
        self.refused.append(f"dispatch a turn of run {run_id}")
        raise ReplayWriteRefused(f"a replay may not dispatch, but the engine asked to dispatch run {run_id}")

    def dispatch_activity(self, run_id: str, seq: int, attempt: int, **kwargs: Any) -> NoReturn:
        self.refused.append(f"dispatch the activity at position {seq} of run {run_id}")
        raise ReplayWriteRefused(f"a replay may not dispatch, but the engine asked to send activity {seq}")


def replay_history(
    claimed: ClaimedRun, *, workflows: Registry = registry, config: EngineConfig | None = None
) -> ReplayResult:
    """Replay ``claimed``'s recorded steps against the workflow code registered in
    ``workflows`` and say whether the code still goes through them.

    A divergence is what would stop the run if a worker replayed it now: an operation
    that does not match the recorded one (the :class:`NonDeterminismError` the engine
    holds runs with), or the function ending (returning, raising, continuing as new)
    before it has gone through the whole history. Past the end of the history the code
    is free: what it does there is new work, which a replay does not judge.

    Writes nothing and executes nothing the history does not record (see the module's
    docstring); ``claimed.db_now`` is the time the replay takes as "now"."""
    history_length = (max(claimed.steps) + 1) if claimed.steps else 0
    try:
        workflow = workflows.get_workflow(claimed.workflow_name)
    except WorkflowNotRegistered:
        return ReplayResult(
            ReplayVerdict.MISSING_WORKFLOW,
            ReplayEnd.NOT_RUN,
            0,
            history_length,
            detail=f"no workflow named {claimed.workflow_name!r} is registered in this code",
        )
    settings = config or EngineConfig()
    store, dispatcher = HistoryOnlyStore(claimed.db_now), RefusingDispatcher()
    engine = Engine(store, dispatcher, lambda: settings, engine_id="replay", workflows=workflows)
    ctx = WorkflowContext(engine, claimed, settings, workflow, read_only=True)
    raised = run_body(workflow, ctx, claimed)
    refused = store.refused + dispatcher.refused
    if refused:
        raise ReplayWriteRefused(
            f"replaying run {claimed.run_id} tried to {refused[0]}; a read-only replay must stop before "
            "any write (this is a bug in django_weft, please report it)"
        )
    replayed = min(ctx._seq, history_length)
    if ctx._fatal is not None:
        return _diverged(ctx._fatal, history_length)
    unwinding = ctx._unwinding
    if isinstance(unwinding, QueryFrontier):
        return ReplayResult(ReplayVerdict.OK, ReplayEnd.END_OF_HISTORY, replayed, history_length)
    if unwinding is not None and not isinstance(unwinding, ContinueAsNew):
        raise AssertionError(f"unexpected unwinding {unwinding!r} in a replay")
    if raised is not None and unwinding is None:
        if ctx._seq < history_length:
            return _diverged(_raised_early(ctx, raised, history_length), history_length)
        description = describe_exception(raised)
        return ReplayResult(
            ReplayVerdict.OK,
            ReplayEnd.RAISED,
            replayed,
            history_length,
            detail=f"{description['type']}: {description['message']}",
        )
    leftover = ctx.unconsumed_history()
    if leftover is not None:
        return _diverged(leftover, history_length)
    end = ReplayEnd.CONTINUED if isinstance(unwinding, ContinueAsNew) else ReplayEnd.RETURNED
    return ReplayResult(ReplayVerdict.OK, end, replayed, history_length)


def _diverged(error: NonDeterminismError, history_length: int) -> ReplayResult:
    divergence = Divergence(
        position=error.position,
        recorded=dict(error.recorded),
        requested=dict(error.requested),
        message=error.message,
    )
    replayed = min(error.position, history_length)
    return ReplayResult(
        ReplayVerdict.DIVERGED, ReplayEnd.DIVERGED, replayed, history_length, divergence=divergence
    )


def _raised_early(ctx: WorkflowContext, raised: Exception, history_length: int) -> NonDeterminismError:
    """The function raised before it went through its history: the run, replayed by a
    worker, would fail there instead of going on as recorded."""
    seq = ctx._seq
    recorded = ctx._steps.get(seq)
    what = f"{recorded.kind} {recorded.name!r}" if recorded else "an operation"
    description = describe_exception(raised)
    return nondeterminism_error(
        ctx._claimed,
        position=seq,
        finding=f"the workflow raised {description['type']}: {description['message']} at position {seq}, "
        f"but the history records {what} there ({history_length} operations in all)",
        remedy="Fix the code so that it goes through the recorded history, or guard the change with "
        "ctx.patched(...)",
        recorded={"kind": recorded.kind, "name": recorded.name} if recorded else {},
        requested={"kind": "raise", "name": description["type"]},
    )


def run_body(workflow: Callable[..., Any], ctx: WorkflowContext, claimed: ClaimedRun) -> Exception | None:
    """Run ``workflow``'s body on ``ctx`` with the run's input until it returns or unwinds
    (a read-only context unwinds where the recorded history ends); return what it raised
    otherwise, or ``None``."""
    try:
        workflow(ctx, *claimed.args, **claimed.kwargs)
    except Unwind:
        return None
    except Exception as exc:
        return exc
    return None
