"""What a parked run waits on, in an operator's words: "signal approve", "timer 14:05",
"activity send_receipt on emails", "child order-7", "queued: concurrency key customer-7
(1 of 1 in use)", "debounced: starts at 14:05:07 (3 starts collapsed)".

Pure: it reads a run's ``waiting_on`` (the shapes the engine parks with; see
:mod:`django_weft.engine.parking`) and, for a wait on queued activities or children, the
history entries at the positions waited for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, tzinfo
from typing import Any, Protocol

from ...engine.flow import DEBOUNCED_REASON, QUEUED_REASON, debounced_text

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
        return _positions(waiting_on, steps or {}, queue_of, tz)
    if kind == QUEUED_REASON:
        # The words the run was queued with; the figures are those of that moment (the
        # run page reads them again: django_weft.runtime.run_slot).
        return str(waiting_on.get("text") or "queued for a concurrency slot")
    if kind == DEBOUNCED_REASON:
        starts_at = _time(waiting_on.get("starts_at"), tz, today, seconds=True) or "?"
        return debounced_text(starts_at, int(waiting_on.get("starts") or 1))
    if kind == "rate_limit":  # an inline activity flow control holds
        return f"{waiting_on.get('activity')}: {_hold_words(waiting_on, str(waiting_on.get('text')), tz)}"
    if kind == "activity_concurrency":  # its text names the activity
        return str(waiting_on.get("text") or "activity concurrency")
    messages = _messages(waiting_on)
    return messages or kind or "something"


def _messages(waiting_on: Mapping[str, Any]) -> str:
    names = [f"signal {name}" for name in waiting_on.get("signals") or []]
    names += [f"update {name}" for name in waiting_on.get("updates") or []]
    return ", ".join(names)


def _positions(
    waiting_on: Mapping[str, Any],
    steps: Mapping[int, WaitedStep],
    queue_of: Callable[[str], str | None],
    tz: tzinfo | None,
) -> str:
    seqs = waited_positions(waiting_on)
    held = waiting_on.get("held") or {}
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
            words = f"{step.kind} {step.name} on {queue}" if queue else f"{step.kind} {step.name}"
            if str(seq) in held:
                words += f" ({_hold_words(step.result, str(held[str(seq)]), tz)})"
            named.append(words)
    if len(seqs) > MAX_NAMED:
        named.append(f"{len(seqs) - MAX_NAMED} more")
    joiner = " or " if waiting_on.get("mode") == "any" else " and "
    return joiner.join(named) if named else "activities"


def _hold_words(result: Any, text: str, tz: tzinfo | None) -> str:
    """Why flow control holds a queued activity, its time in the operator's zone."""
    if isinstance(result, dict) and result.get("kind") == "rate_limit":
        keyed = f" key {result.get('key')}" if result.get("key") else ""
        return f"delayed by rate limit {result.get('name')}{keyed} until {_precise(result.get('until'), tz)}"
    return text


def _precise(raw: Any, tz: tzinfo | None) -> str:
    """A hold's moment to the millisecond, in ``tz``: "14:05:01.250"."""
    try:
        moment = datetime.fromisoformat(str(raw))
    except ValueError:
        return str(raw)
    if tz is not None and moment.tzinfo is not None:
        moment = moment.astimezone(tz)
    return f"{moment:%H:%M:%S}.{moment.microsecond // 1000:03d}"


def _time(raw: Any, tz: tzinfo | None, today: datetime | None, *, seconds: bool = False) -> str:
    if not raw:
        return ""
    try:
        moment = datetime.fromisoformat(str(raw))
    except ValueError:
        return str(raw)
    if tz is not None and moment.tzinfo is not None:
        moment = moment.astimezone(tz)
    clock = "%H:%M:%S" if seconds else "%H:%M"
    if today is not None:
        reference = today.astimezone(moment.tzinfo) if moment.tzinfo and today.tzinfo else today
        if reference.date() == moment.date():
            return moment.strftime(clock)
    return moment.strftime(f"%Y-%m-%d {clock}")
