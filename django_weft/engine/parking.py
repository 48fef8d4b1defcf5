"""What a parked run waits for, and whether it has happened: the engine's decision,
fed with facts the store reads (pending messages, step statuses, live children).

``waiting_on`` is what a turn recorded when it parked: the signal and update names that
wake the run (``signals``, ``updates``), and for a wait on queued activities or children
(``kind == "activities"``) their positions (``seqs``) and ``mode`` (``"any"`` or
``"all"``); ``background`` lists activities started but not waited for.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .error_types import ErrorType
from .flow import HOLD_KINDS, HoldKind
from .records import PENDING_STEP_STATUSES, RunStatus, StepKind, StepStatus, TimerKind

DUE_HOLD = "delayed, due"
"""How :meth:`ParkedWait.satisfied_by` counts a ``delayed`` attempt whose hold is over."""

NEEDS_DECISION = frozenset({StepStatus.ATTEMPT_FAILED, StepStatus.LOST, DUE_HOLD})
"""Attempt outcomes the workflow decides on (retry or fail, or send a held attempt
again), so they wake the run."""


@dataclass(frozen=True)
class ParkedWait:
    """A parked run's ``waiting_on``, read once."""

    signals: tuple[str, ...] = ()
    updates: tuple[str, ...] = ()
    seqs: tuple[int, ...] = ()
    """The positions waited for (queued activities, children); empty unless the wait is on them."""
    background: tuple[int, ...] = ()
    mode: str = "all"
    on_activities: bool = False
    slot_at: int | None = None
    """The position of an inline activity attempt queued for a concurrency slot that the
    run waits for (a slot handed on to it wakes the run)."""

    @classmethod
    def of(cls, waiting_on: Mapping[str, Any]) -> ParkedWait:
        kind = waiting_on.get("kind")
        on_activities = kind == "activities"
        return cls(
            signals=tuple(waiting_on.get("signals") or ()),
            updates=tuple(waiting_on.get("updates") or ()),
            seqs=tuple(waiting_on.get("seqs") or ()) if on_activities else (),
            background=tuple(waiting_on.get("background") or ()),
            mode="any" if waiting_on.get("mode") == "any" else "all",
            on_activities=on_activities,
            slot_at=int(waiting_on["seq"]) if kind == HoldKind.CONCURRENCY and "seq" in waiting_on else None,
        )

    @property
    def step_seqs(self) -> list[int]:
        """The positions whose step statuses decide (waited for, then background)."""
        return list(self.seqs) + list(self.background)

    def satisfied_by(
        self, steps: Iterable[tuple[int, str, str]], live_children: set[int], due_holds: Collection[int] = ()
    ) -> bool:
        """Whether the run needs a turn now because of its queued activities or children,
        given the ``(seq, status, kind)`` of the steps at :attr:`step_seqs`, the positions
        of the children that are still live (see :func:`children_to_check`) and those of
        the ``delayed`` attempts whose hold is over (``due_holds``).

        For a wait on ``any`` of them, one finished; for ``all``, none is pending, or an
        attempt failed or was lost (the workflow decides on the retry), or a held attempt
        is to be sent again. An attempt that failed, was lost or is to be sent again
        among the activities started but not waited for (``background``) counts too,
        whatever the run waits for."""
        status_of: dict[int, str] = {}
        for seq, status, kind in steps:
            if kind == StepKind.CHILD and status == StepStatus.WAITING:
                # A child step stays "waiting" until the parent records the outcome; what
                # counts is whether the child run (or its continued-as-new successor) is live.
                status = StepStatus.SCHEDULED if seq in live_children else StepStatus.COMPLETED
            elif status == StepStatus.DELAYED and seq in due_holds:
                status = DUE_HOLD
            status_of[seq] = status
        if any(status_of.get(seq) in NEEDS_DECISION for seq in self.background):
            return True
        if not self.on_activities:
            return False
        pending = [status_of.get(seq) in PENDING_STEP_STATUSES for seq in self.seqs]
        if self.mode == "any":
            return not all(pending)
        return not any(pending) or any(status_of.get(seq) in NEEDS_DECISION for seq in self.seqs)


def children_to_check(steps: Iterable[tuple[int, str, str]]) -> list[int]:
    """The positions among ``(seq, status, kind)`` steps whose child run's liveness
    decides the wait: child steps not yet recorded as finished."""
    return [seq for seq, status, kind in steps if kind == StepKind.CHILD and status == StepStatus.WAITING]


class TimerDisposition(enum.StrEnum):
    """What happens to a run's timers when a wake-up for it is discarded (the engine that
    got it cannot claim the run): the seed's ``resolveDiscardedTimerDisposition``."""

    KEPT = "kept"
    COLLECTED = "collected"


_OWNED_OR_DUE_STATUSES = frozenset({RunStatus.RUNNING, RunStatus.WAITING, RunStatus.PENDING})


def discarded_wake_disposition(status: str | None) -> TimerDisposition:
    """Kept while the run is running, waiting or pending (its owner, or the sweep, needs
    the timers); collected when it is gone, finished or suspended."""
    return TimerDisposition.KEPT if status in _OWNED_OR_DUE_STATUSES else TimerDisposition.COLLECTED


def timers_surviving_collection(status: str | None) -> frozenset[TimerKind]:
    """The kinds of unfired timers a collection leaves to a run in ``status`` (``None``:
    the run is gone). A suspended run keeps its deadline and its queued attempts' leases
    (resume re-arms the wait's timer); a finished run keeps its finalizer's."""
    if status is None:
        return frozenset()
    if status == RunStatus.SUSPENDED:
        return frozenset({TimerKind.DEADLINE, TimerKind.ACTIVITY, TimerKind.FINALIZER})
    return frozenset({TimerKind.FINALIZER})


NO_MESSAGES_KINDS = frozenset({"retry", *HOLD_KINDS})
"""The parks that do not handle messages (``wakes_on_messages=False``): an activity's
durable retry timer, and an inline attempt flow control holds."""


def handled_updates(waiting_on: Mapping[str, Any] | None, status: str) -> frozenset[str] | None:
    """The update names a run parked with ``waiting_on`` (in ``status``) can apply where
    it blocks, or ``None`` when that is not known (it is not parked at a blocking point
    that handles messages). An update of any other name is refused: the run will not
    register a handler before it moves on."""
    if status not in (RunStatus.WAITING, RunStatus.SUSPENDED) or not waiting_on:
        return None
    if waiting_on.get("kind") in NO_MESSAGES_KINDS:
        return None  # a durable retry or a held attempt: messages wait for the next blocking point
    # Every other park lists the update handlers it has under "updates" (none: no key).
    return frozenset(waiting_on.get("updates") or ())


def unknown_update_error(name: str, handled: Iterable[str]) -> dict[str, Any]:
    """The stored error of an update refused because the run blocks without its handler."""
    registered = sorted(handled)
    return {
        "type": ErrorType.UNKNOWN_HANDLER,
        "message": f"the workflow has no handler for update {name!r} at the point where it waits "
        f"(handlers: {', '.join(registered) or 'none'})",
        "registered": registered,
    }
