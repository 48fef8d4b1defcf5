"""Observation points: where the engine and the runtime say what they did, for metrics,
traces and logs to listen to.

An :class:`Observer` overrides the methods it cares about; :func:`add_observer` registers
it in this process. The engine and the runtime call the module's functions (``run_started``,
``turn``, ``activity_attempt``...) at the one place each event is decided, once per real
event: a step replayed from its record is not an event, and nothing here fires for it.

Two promises to the code that calls these points:

- **An observer never breaks a run.** An exception raised by an observer is logged (with
  its traceback, on ``django_weft.observe``) and swallowed; the run goes on as if no
  observer were registered.
- **No observer, no cost.** The registered observers are a tuple read once per point; with
  none registered a point is that read and a falsy test (the context managers hand back
  one shared no-op object). The hot path (``benchmarks/steps.py``) must not notice them.

The module imports nothing from Django or the rest of the package besides the engine's
records, so an observer can be written and tested without a database.
"""

from __future__ import annotations

import contextlib
import enum
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .run_logging import get_logger
from .unwind import DeposedUnwind

if TYPE_CHECKING:
    from .attempt import ActivityInfo
    from .records import ClaimedRun

logger = get_logger("django_weft.observe")

Carrier = dict[str, str]
"""A trace context carried across the durable gap (W3C ``traceparent``/``tracestate``...),
opaque to the engine: tracing fills it at start, the start stores it with the run."""


class StartKind(enum.StrEnum):
    """What a claim took, for :meth:`Observer.schedule_to_start`."""

    FIRST_TURN = "first_turn"
    """A run's first turn: due at its ``ready_at`` (its start, or a delayed start's time)."""
    WOKEN = "woken"
    """A later turn of a run woken by a timer, a message, an activity or a child: due when
    it became runnable (a timer's ``fire_at`` for a run woken by its own claim)."""
    TAKEOVER = "takeover"
    """A run taken over from an owner whose lease expired: due when that lease expired."""
    ACTIVITY = "activity"
    """A queued activity attempt taken by a worker: due when its turn scheduled it."""


class AttemptOutcome(enum.StrEnum):
    """How an activity attempt that really ran (or was held before running) ended."""

    COMPLETED = "completed"
    FAILED = "failed"
    """Failed for good: no attempt follows (not retryable, or its attempts used up)."""
    RETRIED = "retried"
    """Failed, and another attempt follows (inline at once, or after a durable timer)."""
    ATTEMPT_FAILED = "attempt_failed"
    """A queued attempt failed; its workflow decides at its next turn whether it is retried."""
    HELD = "held"
    """Flow control held it (a rate limit, a concurrency slot) before its function ran."""
    DISCARDED = "discarded"
    """A queued attempt ran, but was no longer current when its outcome was recorded."""
    DEPOSED = "deposed"
    """An inline attempt ran, but its turn lost the run before recording it."""


@dataclass(slots=True)
class TurnScope:
    """What :func:`turn` hands its block and its observers: the claimed run, and
    ``outcome`` (a :class:`~django_weft.engine.executor.TurnOutcome` value) set by the
    engine before the block exits."""

    claimed: ClaimedRun
    engine_id: str
    takeover: bool
    outcome: str = ""
    exception: BaseException | None = None
    """What the block raised (outcome ``error``), if it raised."""
    started: float = field(default_factory=time.perf_counter)
    state: dict[int, Any] = field(default_factory=dict)
    """Per-observer state (by ``id(observer)``): a span, a timer..., kept between the
    ``enter`` and ``exit`` calls of the same scope."""


@dataclass(slots=True)
class AttemptScope:
    """What :func:`activity_attempt` hands its block and its observers."""

    info: ActivityInfo
    queue: str | None
    """The activity's queue; ``None`` for an inline activity (run in its workflow's turn)."""
    inline: bool
    epoch: int | None = None
    """The run's epoch of the turn running an inline attempt; ``None`` for a queued one."""
    carrier: Carrier | None = None
    """A queued attempt's run's stored trace context (an inline attempt's turn has it, in
    ``ClaimedRun.trace_context``); ``None`` for an inline attempt."""
    outcome: str = ""
    error: dict[str, Any] | None = None
    """The attempt's error as recorded (``type``, ``message``, ``traceback``), if it failed."""
    exception: BaseException | None = None
    """What the block raised (outcome ``error``, or set by the engine), if it raised."""
    started: float = field(default_factory=time.perf_counter)
    state: dict[int, Any] = field(default_factory=dict)


@dataclass(slots=True)
class StartScope:
    """What :func:`starting` hands its block: a start on its way through the runtime. The
    block sets ``run_id``, ``workflow_id`` and ``created`` (``False``: an existing run was
    returned) once the start has decided."""

    workflow: str
    run_id: str = ""
    workflow_id: str = ""
    created: bool = False
    outcome: str = ""
    exception: BaseException | None = None
    started: float = field(default_factory=time.perf_counter)
    state: dict[int, Any] = field(default_factory=dict)


@dataclass(slots=True)
class FireScope:
    """What :func:`firing` hands its block: a schedule's fire that starts a run."""

    schedule_id: str
    workflow: str
    outcome: str = ""
    exception: BaseException | None = None
    started: float = field(default_factory=time.perf_counter)
    state: dict[int, Any] = field(default_factory=dict)


@dataclass(slots=True)
class MessageScope:
    """What :func:`message_received` hands its block: a signal, update or query on its way
    through the runtime. ``run_id`` and ``workflow`` are filled once the run is found;
    ``outcome`` is ``"ok"`` or the error's class name at exit."""

    kind: str
    """``"signal"``, ``"update"`` or ``"query"``."""
    name: str
    ref: str
    """What the caller named the run by (a run id or a workflow id)."""
    run_id: str | None = None
    workflow: str | None = None
    carrier: Carrier | None = None
    """The sender's trace context, for tracing to link to (set by the sender's observer)."""
    outcome: str = ""
    exception: BaseException | None = None
    started: float = field(default_factory=time.perf_counter)
    state: dict[int, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueSample:
    """What the tick reads of the work waiting, for gauges (:meth:`Observer.queue_sampled`).
    Each figure is read from an index (never a scan of the run table)."""

    read_at: datetime
    runs_by_status: dict[str, int]
    """Runs per status: exact for the active statuses, estimated for the others where
    :attr:`estimated` says so."""
    estimated: frozenset[str]
    """The statuses of :attr:`runs_by_status` whose figure is an estimate (PostgreSQL's
    statistics), not a count."""
    due_timers: int
    """Timers due and not fired yet."""
    oldest_due_age: float | None
    """Seconds since the oldest due item was due: an unfired timer, or a runnable run no
    worker has claimed; ``None`` when nothing is due."""
    queued_by_key: dict[tuple[str, str], int]
    """Runs queued for a concurrency slot, by (workflow, concurrency key)."""


class Observer:
    """Listens to the observation points. Every method does nothing: override those you need.

    Methods are called in the thread where the event happens (a turn's, an activity's,
    the sweep's), possibly in several threads at once. They must be quick; an exception
    is logged and swallowed."""

    samples_queues: bool = False
    """Whether the tick should read a :class:`QueueSample` for this observer (a few index
    reads, at most every ``WEFT_METRICS_SAMPLE_INTERVAL``)."""

    def run_started(
        self,
        *,
        run_id: str,
        workflow_id: str,
        workflow: str,
        priority: int,
        carrier: Carrier | None,
    ) -> None:
        """A new run was inserted (by ``start``, ``start_with``, ``signal_with_start``, a
        schedule's fire; a child's start by its parent's turn), called in the starting
        transaction before it commits (a start rolled back afterwards still fired it; a
        child's, after its parent's fenced write).
        ``carrier`` is what the run stored for tracing (filled by :meth:`fill_carrier`),
        or ``None``; it is read-only here."""

    def fill_carrier(self, carrier: Carrier) -> None:
        """A run is about to be inserted: put in ``carrier`` what its turns will need to
        continue the current trace (W3C ``traceparent``...). Stored with the run, handed
        back as :attr:`~django_weft.engine.records.ClaimedRun.trace_context`."""

    def start_began(self, scope: StartScope) -> None:
        """A start (``start``, ``start_with``, ``signal_with_start``; REST, admin and task
        starts go through them) is about to validate and insert: what is current in this
        thread until :meth:`start_ended` is what :func:`start_carrier` captures."""

    def start_ended(self, scope: StartScope) -> None:
        """The start returned (``scope.run_id``...) or raised (``scope.exception``)."""

    def turn_started(self, scope: TurnScope) -> None:
        """A turn claimed its run (``scope.takeover``: from an owner whose lease expired)
        and is about to replay and drive it."""

    def turn_finished(self, scope: TurnScope) -> None:
        """The turn ended: ``scope.outcome`` is ``parked``, ``completed``, ``failed``,
        ``cancelled``, ``continued``, ``deposed``, ``released``, or ``error`` for a turn
        that raised (``scope.exception``)."""

    def attempt_started(self, scope: AttemptScope) -> None:
        """An activity attempt is about to run for real: inline in a turn (not one replayed
        from its record) or queued on a worker that took it."""

    def attempt_finished(self, scope: AttemptScope) -> None:
        """The attempt ended: ``scope.outcome`` is an :class:`AttemptOutcome`, ``scope.error``
        its recorded error if it failed."""

    def schedule_to_start(
        self, *, kind: StartKind, delay: float, workflow: str, activity: str | None
    ) -> None:
        """A claim took work that was due ``delay`` seconds before (0 when not late; the
        database's clock on both sides). Called once per claim: a turn's claim, a queued
        attempt taken by a worker."""

    def message_started(self, scope: MessageScope) -> None:
        """The runtime received a signal, update or query and is about to handle it."""

    def message_finished(self, scope: MessageScope) -> None:
        """The runtime handled it (stored a signal, applied and answered an update or failed
        to, answered a query); ``scope.outcome`` says how."""

    def message_delivered(self, *, run_id: str, kind: str, name: str, carrier: Carrier | None) -> None:
        """A turn consumed a signal or applied an update for real (not replayed from its
        record); ``carrier`` is the trace context its sender stored with it."""

    def timer_fired(
        self,
        *,
        run_id: str,
        seq: int,
        kind: str,
        fire_at: datetime | None,
        fired_at: datetime,
        carrier: Carrier | None = None,
    ) -> None:
        """The sweep fired a durable timer (a sleep, a retry, a deadline, an activity's lease,
        a delayed start): ``kind`` is its ``TimerKind``, ``carrier`` the trace context its
        run's start stored. Timers a claim fires on its own are reported by that turn's
        ``schedule_to_start``."""

    def schedule_fired(self, *, schedule_id: str, workflow: str, outcome: str, run_id: str | None) -> None:
        """A schedule fired (by the tick, a trigger, a backfill, or a buffered fire let go):
        ``outcome`` is ``started``, ``skipped``, ``buffered``, ``cancelled_other``...
        (the schedule's action in its recent actions), ``run_id`` the run it started."""

    def fire_began(self, scope: FireScope) -> None:
        """A schedule's fire is about to start its run: what is current in this thread
        until :meth:`fire_ended` is the parent of the start (:meth:`start_began`), and its
        :meth:`schedule_fired` is reported inside it."""

    def fire_ended(self, scope: FireScope) -> None:
        """The fire of :meth:`fire_began` has started its run, or failed to."""

    def lease_taken_over(self, *, run_id: str, workflow: str, engine_id: str, epoch: int) -> None:
        """A turn claimed a run whose previous owner's lease had expired (``epoch`` is the new one)."""

    def deposed_write(self, *, run_id: str, engine_id: str, epoch: int) -> None:
        """Fencing refused a write of a stale owner (``epoch`` is the one it held): the
        run belongs to a newer epoch, and this owner's turn stops."""

    def queue_sampled(self, sample: QueueSample) -> None:
        """The tick read the work waiting (only when an observer :attr:`samples_queues`)."""

    def run_finished(self, *, run_id: str, workflow_id: str, workflow: str, status: str) -> None:
        """A run reached a terminal status in a turn (``completed``, ``failed``,
        ``cancelled``, ``continued_as_new``) or by an external transition (cancel, time
        out), after its terminal write."""


_observers: tuple[Observer, ...] = ()
_handlers: dict[str, tuple[Any, ...]] = {}
"""Per point, the bound methods of the observers that override it (the others' would do
nothing): set with :data:`_observers`."""
_lock = threading.Lock()


def _set(observers: tuple[Observer, ...]) -> None:
    global _observers, _handlers
    _handlers = {
        name: tuple(getattr(each, name) for each in observers if getattr(type(each), name) is not member)
        for name, member in vars(Observer).items()
        if callable(member) and not name.startswith("_")
    }
    _observers = observers


def add_observer(observer: Observer) -> None:
    """Register ``observer`` in this process (once: adding it again does nothing)."""
    with _lock:
        if observer not in _observers:
            _set((*_observers, observer))


def remove_observer(observer: Observer) -> None:
    """Unregister ``observer`` (nothing happens if it is not registered)."""
    with _lock:
        _set(tuple(each for each in _observers if each is not observer))


def observers() -> tuple[Observer, ...]:
    """The observers registered in this process, in the order they were added."""
    return _observers


def _call(method: str, *args: Any, **kwargs: Any) -> None:
    _notify(_handlers.get(method, ()), method, *args, **kwargs)


def _notify(handlers: tuple[Any, ...], point: str, *args: Any, **kwargs: Any) -> None:
    """Call each of ``handlers`` (the observers' methods for ``point``); what one raises
    is logged and ignored."""
    for handler in handlers:
        try:
            handler(*args, **kwargs)
        except Exception:
            owner = getattr(handler, "__self__", handler)
            logger.exception("observer %r failed in %s; ignored", owner, point)


# -- points ---------------------------------------------------------------------------------


def run_started(
    *, run_id: str, workflow_id: str, workflow: str, priority: int = 0, carrier: Carrier | None = None
) -> None:
    """See :meth:`Observer.run_started`."""
    if _observers:
        _call("run_started", run_id=run_id, workflow_id=workflow_id, workflow=workflow, priority=priority,
              carrier=carrier)  # fmt: skip


def start_carrier() -> Carrier | None:
    """The carrier a run (or a signal or update) about to be inserted stores for tracing,
    filled by the observers' :meth:`Observer.fill_carrier`; ``None`` when none filled it
    (nothing to store)."""
    if not _observers:
        return None
    carrier: Carrier = {}
    _call("fill_carrier", carrier)
    return carrier or None


class _Nothing:
    """What a point's block gets with no observer: attributes set on it are dropped."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        pass


_NOTHING: Any = _Nothing()


class _Scoped:
    """Calls the observers' ``enter`` with the scope at the block's start and their
    ``leave`` at its end; an exception leaving the block is the scope's (outcome
    ``deposed`` or ``error`` unless the block set one). The observers are those registered
    when the block began, so each that saw its start sees its end. A class rather than a
    generator: it is on the hot path."""

    __slots__ = ("enter", "leave", "points", "scope")

    def __init__(self, scope: Any, enter: str, leave: str) -> None:
        self.scope, self.points = scope, (enter, leave)
        handlers = _handlers
        self.enter: tuple[Any, ...] = handlers.get(enter, ())
        self.leave: tuple[Any, ...] = handlers.get(leave, ())

    def __enter__(self) -> Any:
        _notify(self.enter, self.points[0], self.scope)
        return self.scope

    def __exit__(self, kind: Any, exc: BaseException | None, traceback: Any) -> None:
        scope = self.scope
        if exc is not None:
            if not scope.outcome:
                scope.outcome = "deposed" if isinstance(exc, DeposedUnwind) else "error"
            scope.exception = exc
        _notify(self.leave, self.points[1], scope)


_NULL = contextlib.nullcontext(_NOTHING)


def turn(claimed: ClaimedRun, engine_id: str, *, takeover: bool) -> contextlib.AbstractContextManager[Any]:
    """Around one claimed turn, from the claim to its commit (:meth:`Observer.turn_started`,
    :meth:`Observer.turn_finished`). The block sets ``scope.outcome``."""
    if not _observers:
        return _NULL
    return _Scoped(TurnScope(claimed, engine_id, takeover), "turn_started", "turn_finished")


def activity_attempt(
    info: ActivityInfo,
    *,
    queue: str | None,
    inline: bool,
    epoch: int | None = None,
    carrier: Carrier | None = None,
) -> contextlib.AbstractContextManager[Any]:
    """Around one activity attempt that really runs (:meth:`Observer.attempt_started`,
    :meth:`Observer.attempt_finished`). The block sets ``scope.outcome`` (an
    :class:`AttemptOutcome`) and ``scope.error`` (the recorded error dict)."""
    if not _observers:
        return _NULL
    return _Scoped(
        AttemptScope(info, queue, inline, epoch, carrier=carrier), "attempt_started", "attempt_finished"
    )


def message_received(kind: str, name: str, ref: Any) -> contextlib.AbstractContextManager[Any]:
    """Around the runtime's handling of a signal, update or query
    (:meth:`Observer.message_started`, :meth:`Observer.message_finished`)."""
    if not _observers:
        return _NULL
    return _Scoped(MessageScope(kind, str(name), str(ref)), "message_started", "message_finished")


def run_claimed(claimed: ClaimedRun, engine_id: str) -> None:
    """A turn claimed a run: :meth:`Observer.lease_taken_over` if it took it over, and
    :meth:`Observer.schedule_to_start` (``first_turn`` for the run's first turn: nothing
    recorded yet, though an earlier claim may have been released without a turn; else
    ``woken``, or ``takeover``) from ``claimed.due_at`` to the claim: to the turn's start
    for a run a worker's sweep claimed for its threads (``claimed.db_now`` moved on by the
    time the claim waited in the worker's queue)."""
    if not _observers:
        return
    if claimed.takeover:
        kind = StartKind.TAKEOVER
        lease_taken_over(run_id=claimed.run_id, workflow=claimed.workflow_name, engine_id=engine_id,
                         epoch=claimed.epoch)  # fmt: skip
    else:
        # A run that recorded nothing never parked: it cannot have been woken.
        kind = StartKind.FIRST_TURN if claimed.epoch == 1 or not claimed.steps else StartKind.WOKEN
    schedule_to_start(kind, claimed.due_at, claimed.db_now, workflow=claimed.workflow_name)


def starting(workflow: str) -> contextlib.AbstractContextManager[Any]:
    """Around a start in the runtime (:meth:`Observer.start_began`, :meth:`Observer.start_ended`)."""
    if not _observers:
        return _NULL
    return _Scoped(StartScope(workflow), "start_began", "start_ended")


def firing(schedule_id: str, workflow: str) -> contextlib.AbstractContextManager[Any]:
    """Around a schedule's fire that starts a run (:meth:`Observer.fire_began`,
    :meth:`Observer.fire_ended`)."""
    if not _observers:
        return _NULL
    return _Scoped(FireScope(schedule_id, workflow), "fire_began", "fire_ended")


def message_delivered(*, run_id: str, kind: str, name: str, carrier: Carrier | None) -> None:
    """See :meth:`Observer.message_delivered`."""
    if _observers:
        _call("message_delivered", run_id=run_id, kind=kind, name=name, carrier=carrier)


def schedule_to_start(
    kind: StartKind,
    due: datetime | None,
    claimed_at: datetime | None,
    *,
    workflow: str,
    activity: str | None = None,
) -> None:
    """See :meth:`Observer.schedule_to_start`; a time not known (``None``) counts as no delay."""
    if _observers:
        late = (claimed_at - due).total_seconds() if due is not None and claimed_at is not None else 0.0
        delay = max(0.0, late)
        _call("schedule_to_start", kind=kind, delay=delay, workflow=workflow, activity=activity)


def timer_fired(
    *,
    run_id: str,
    seq: int,
    kind: str,
    fire_at: datetime | None,
    fired_at: datetime,
    carrier: Carrier | None = None,
) -> None:
    """See :meth:`Observer.timer_fired`."""
    if _observers:
        _call(
            "timer_fired",
            run_id=run_id,
            seq=seq,
            kind=kind,
            fire_at=fire_at,
            fired_at=fired_at,
            carrier=carrier,
        )


def schedule_fired(*, schedule_id: str, workflow: str, outcome: str, run_id: str | None = None) -> None:
    """See :meth:`Observer.schedule_fired`."""
    if _observers:
        _call("schedule_fired", schedule_id=schedule_id, workflow=workflow, outcome=outcome, run_id=run_id)


def lease_taken_over(*, run_id: str, workflow: str, engine_id: str, epoch: int) -> None:
    """See :meth:`Observer.lease_taken_over`."""
    if _observers:
        _call("lease_taken_over", run_id=run_id, workflow=workflow, engine_id=engine_id, epoch=epoch)


def deposed_write(*, run_id: str, engine_id: str, epoch: int) -> None:
    """See :meth:`Observer.deposed_write`."""
    if _observers:
        _call("deposed_write", run_id=run_id, engine_id=engine_id, epoch=epoch)


def run_finished(*, run_id: str, workflow_id: str, workflow: str, status: str) -> None:
    """See :meth:`Observer.run_finished`."""
    if _observers:
        _call("run_finished", run_id=run_id, workflow_id=workflow_id, workflow=workflow, status=status)


def wants_queue_samples() -> bool:
    """Whether a registered observer :attr:`~Observer.samples_queues`."""
    return any(observer.samples_queues for observer in _observers)


def queue_sampled(sample: QueueSample) -> None:
    """See :meth:`Observer.queue_sampled`."""
    if _observers:
        _call("queue_sampled", sample)
