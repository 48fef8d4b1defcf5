"""What a parked run waits on, in an operator's words: "signal approve", "timer 14:05",
"activity send_receipt on emails", "child order-7".

Pure: it reads a run's ``waiting_on`` (the shapes the engine parks with; see
:mod:`django_weft.engine.parking`) and, for a wait on queued activities or children, the
history entries at the positions waited for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, tzinfo
from typing import Any, Protocol

MAX_NAMED = 3
"""Positions named one by one before the rest are counted ("and 4 more")."""


class WaitedStep(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def result(self) -> Any: ...


def waited_positions(waiting_on: Mapping[str, Any] | None) -> list[int]:
    """The history positions whose steps name what the run waits for (queued activities,
    children); empty for waits on timers and messages."""
    if not waiting_on or waiting_on.get("kind") != "activities":
        return []
    return [int(seq) for seq in waiting_on.get("seqs") or []]


def describe_wait(
    waiting_on: Mapping[str, Any] | None,
    *,
    steps: Mapping[int, WaitedStep] | None = None,
    queue_of: Callable[[str], str | None] = lambda name: None,
    tz: tzinfo | None = None,
    today: datetime | None = None,
) -> str:
    """``waiting_on`` in words; ``""`` when the run waits on nothing.

    ``steps`` are the entries at :func:`waited_positions`; ``queue_of`` names an activity's
    queue (from the registry); times are shown in ``tz``, with the date unless it is the
    date of ``today``."""
    if not waiting_on:
        return ""
    kind = str(waiting_on.get("kind") or "")
    timer = _time(waiting_on.get("fire_at"), tz, today)
    if kind == "sleep":
        return f"timer {timer}" if timer else "timer"
    if kind == "retry":
        activity = waiting_on.get("activity") or "an activity"
        return f"retry of {activity}, timer {timer}" if timer else f"retry of {activity}"
    if kind == "signal":
        words = f"signal {waiting_on.get('name')}"
        return f"{words} or timer {timer}" if timer else words
    if kind == "condition":
        messages = _messages(waiting_on)
        words = f"condition on {messages}" if messages else "condition"
        return f"{words} or timer {timer}" if timer else words
    if kind == "activities":
        return _positions(waiting_on, steps or {}, queue_of)
    messages = _messages(waiting_on)
    return messages or kind or "something"


def _messages(waiting_on: Mapping[str, Any]) -> str:
    names = [f"signal {name}" for name in waiting_on.get("signals") or []]
    names += [f"update {name}" for name in waiting_on.get("updates") or []]
    return ", ".join(names)


def _positions(
    waiting_on: Mapping[str, Any], steps: Mapping[int, WaitedStep], queue_of: Callable[[str], str | None]
) -> str:
    seqs = waited_positions(waiting_on)
    named = []
    for seq in seqs[:MAX_NAMED]:
        step = steps.get(seq)
        if step is None:
            named.append(f"step #{seq}")
        elif step.kind == "child":
            workflow_id = (step.result or {}).get("workflow_id") if isinstance(step.result, dict) else None
            named.append(f"child {workflow_id or step.name}")
        else:
            queue = queue_of(step.name)
            named.append(f"{step.kind} {step.name} on {queue}" if queue else f"{step.kind} {step.name}")
    if len(seqs) > MAX_NAMED:
        named.append(f"{len(seqs) - MAX_NAMED} more")
    joiner = " or " if waiting_on.get("mode") == "any" else " and "
    return joiner.join(named) if named else "activities"


def _time(raw: Any, tz: tzinfo | None, today: datetime | None) -> str:
    if not raw:
        return ""
    try:
        moment = datetime.fromisoformat(str(raw))
    except ValueError:
        return str(raw)
    if tz is not None and moment.tzinfo is not None:
        moment = moment.astimezone(tz)
    if today is not None:
        reference = today.astimezone(moment.tzinfo) if moment.tzinfo and today.tzinfo else today
        if reference.date() == moment.date():
            return moment.strftime("%H:%M")
    return moment.strftime("%Y-%m-%d %H:%M")
