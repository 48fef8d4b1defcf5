"""The workflow context: the replay cursor and the ``ctx`` API workflow code calls.

Every durable operation takes the next sequence number of the run. If a step is
recorded at that number, the operation must match it (kind and name) and returns the
recorded outcome; otherwise the operation executes now and its outcome is recorded
with a fenced write before the workflow continues.

The context keeps the cursor (position, recorded history, the turn's fence and its
unwinding) and delegates the larger jobs to the modules named by them: ``activities``
(ctx.run, ctx.start), ``messages`` (signals, updates, queries and their handlers),
``children`` (child workflows), ``sleeps`` (ctx.sleep, ctx.sleep_until), ``waits``
(wait_all, wait_any) and ``workflow_info``
(``ctx.info`` and ``ctx.logger``). Those call back into the cursor's underscore methods
(``_next``, ``_commit``, ``_park``...), which are the engine's internal interface, not
workflow API.
"""

from __future__ import annotations

import logging
import random as _random
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from . import clock, codec, faults, waits
from .activities import ActivityCalls, ActivityHandle
from .attempt import MAX_REDISPATCH_DELAY, ActivityInfo, _current_activity, activity_info, describe_exception
from .children import ChildHandle, start_child
from .durations import Duration, parse_duration
from .errors import ConfigurationError, Deposed, NonDeterminismError, nondeterminism_error
from .fencing import Fence
from .messages import (
    MAX_MESSAGE_NAME_LENGTH,
    MessageHandling,
    UpdateHandler,
    check_message_name,
)
from .records import ClaimedRun, StepKind, StepRecord, StepStatus, StepWrite, TimerWrite
from .registry import Activity, Workflow, as_activity
from .search_attributes import check_search_attributes, step_name
from .sleeps import durable_sleep
from .unwind import ContinueAsNew, DeposedUnwind, Park, QueryFrontier, Unwind
from .waits import Handle
from .workflow_info import ReplayAwareLogger, WorkflowInfo, schedule_info

if TYPE_CHECKING:
    from .executor import Engine, EngineConfig

T = TypeVar("T")

# Names that lived here before the context was split; their imports keep working.
__all__ = [
    "MAX_MESSAGE_NAME_LENGTH",
    "MAX_REDISPATCH_DELAY",
    "ActivityHandle",
    "ActivityInfo",
    "ChildHandle",
    "ContinueAsNew",
    "DeposedUnwind",
    "Handle",
    "Park",
    "QueryFrontier",
    "UpdateHandler",
    "WorkflowContext",
    "WorkflowInfo",
    "_current_activity",
    "activity_info",
    "check_message_name",
    "describe_exception",
]


class WorkflowContext:
    """Passed as the first argument of every workflow function."""

    def __init__(
        self,
        engine: Engine,
        claimed: ClaimedRun,
        config: EngineConfig,
        workflow: Workflow[..., Any],
        *,
        read_only: bool = False,
        due_sleeps_over: bool = False,
    ) -> None:
        self._engine = engine
        # Read-only replay (queries, update validation): recorded outcomes are returned,
        # and the first operation that would execute or write anything ends the replay.
        self._read_only = read_only
        # In a read-only replay, a recorded sleep whose time has come is over though its
        # end is not recorded yet (a query, a reset's replay); the replay check stops there.
        self._due_sleeps_over = due_sleeps_over
        self._claimed = claimed
        self._config = config
        self._workflow = workflow
        self._fence = Fence(
            claimed.run_id,
            engine.engine_id,
            claimed.epoch,
            self._depose,
            commit_step=engine.store.commit_step,
            on_written=self._step_written,
        )
        self._steps = dict(claimed.steps)
        self._history_length = (max(claimed.steps) + 1) if claimed.steps else 0
        self._seq = 0
        self._clock_origin = clock.monotonic()
        self._patches: dict[str, bool] = {}
        self._unwinding: Unwind | None = None
        self._fatal: NonDeterminismError | None = None
        # Set while a signal or update handler runs: it may not block.
        self._in_handler: str | None = None
        self._frontier_in_handler: str | None = None
        # A cancellation request pending at the claim: received at the first blocking point.
        self._cancel_request = None if read_only else claimed.cancel_request
        self._activities = ActivityCalls(self)
        self._messages = MessageHandling(self)
        # The handler tables, read by the runtime (queries, update validation); not
        # workflow API (the reference lists the members that are).
        self.signal_handlers = self._messages.signal_handlers
        self.update_handlers = self._messages.update_handlers
        self.query_handlers = self._messages.query_handlers
        self.info = WorkflowInfo(
            run_id=claimed.run_id,
            workflow_id=claimed.workflow_id,
            workflow_name=claimed.workflow_name,
            attempt=claimed.attempt,
            started_at=claimed.created_at,
            search_attributes=claimed.search_attributes,
            priority=claimed.priority,
            **schedule_info(claimed.search_attributes),
        )
        """This run: run id, workflow id, workflow name, attempt, start time (and, for a
        scheduled run, its schedule)."""
        self.logger: logging.LoggerAdapter[logging.Logger] = ReplayAwareLogger(
            logging.getLogger(f"django_weft.workflow.{workflow.name}"), self
        )
        """A logger (``django_weft.workflow.<name>``) that is silent while the run replays
        recorded history, so each line is logged once; lines carry the run's ids."""

    # -- the replay cursor ---------------------------------------------------------------

    @property
    def is_replaying(self) -> bool:
        """True while the function re-executes operations that are already recorded
        (and always in a read-only replay)."""
        return self._read_only or self._seq < self._history_length

    def _db_now(self) -> datetime:
        # The database's clock at claim time plus the time elapsed since, so timer
        # fire times and due checks agree with the sweep, which uses the database clock
        # (both the virtual clock's in a test that installed one).
        return self._claimed.db_now + timedelta(seconds=clock.monotonic() - self._clock_origin)

    def _enter(self) -> None:
        if self._unwinding is not None:
            raise self._unwinding
        if self._fatal is not None:
            raise self._fatal
        if not self._read_only and self._engine.is_lost(self._claimed.run_id, self._claimed.epoch):
            self._depose(
                Deposed(
                    f"run {self._claimed.run_id} was taken over by another engine; stopped driving it",
                    run_id=self._claimed.run_id,
                )
            )

    def _depose(self, cause: Deposed) -> NoReturn:
        """Stop driving the run for good: every later operation re-raises the unwinding."""
        self._unwinding = DeposedUnwind(cause)
        raise self._unwinding

    def _frontier(self) -> None:
        """In a read-only replay, end it here: the operation would execute or write."""
        if self._read_only:
            # Where the replay ended: in the body, or inside a handler (a reset must not
            # cut a handler application from the steps it took).
            self._frontier_in_handler = self._in_handler
            self._unwinding = QueryFrontier("end of the recorded history")
            raise self._unwinding

    def _forbid_in_handler(self, what: str) -> None:
        if self._in_handler is not None:
            raise ConfigurationError(
                f"the {self._in_handler} may not {what}: handlers run while the workflow is "
                "blocked, so they may run inline activities (ctx.run) and record values, but "
                "not sleep, wait or start queued work; move the wait into the workflow body"
            )

    def _hold(self, error: NonDeterminismError) -> NoReturn:
        """Hold the run: the code no longer matches its history. Every later operation of
        the turn raises the same error, and the run fails as non-deterministic."""
        self._fatal = error
        raise error

    def _diverged(
        self, recorded: StepRecord, finding: str, remedy: str, requested: dict[str, Any] | None = None
    ) -> NoReturn:
        """Hold the run: its code asks for ``requested`` where the history records
        ``recorded``; by default, for a handler application (the code asked for nothing)."""
        self._hold(
            nondeterminism_error(
                self._claimed,
                position=recorded.seq,
                finding=finding,
                remedy=remedy,
                recorded={"kind": recorded.kind, "name": recorded.name},
                requested=requested or {"kind": StepKind.HANDLER, "name": ""},
            )
        )

    def _next(self, kind: str, name: str) -> tuple[int, StepRecord | None]:
        # A step held back is recorded before the workflow goes on (a sleep's end may ride on).
        self._fence.flush(keep_riding=True)
        self._enter()
        seq = self._seq
        self._seq += 1
        recorded = self._steps.get(seq)
        if recorded is not None and (recorded.kind != kind or recorded.name != name):
            self._diverged(
                recorded,
                f"at position {seq} the history records {recorded.kind} {recorded.name!r}, "
                f"but the code now asks for {kind} {name!r}",
                "Restore the previous order for running workflows, or guard the change with ctx.patched(...)",
                requested={"kind": kind, "name": name},
            )
        return seq, recorded

    def _handler_position(self) -> int:
        """The next position, for a record the body's code does not ask for (a handler
        application, a wait's marker): it must be past the recorded history."""
        seq = self._seq
        recorded = self._steps.get(seq)
        if recorded is not None:
            self._diverged(
                recorded,
                f"the workflow blocks at position {seq}, where the history records {recorded.kind} "
                f"{recorded.name!r}",
                "Restore the previous code for running workflows, or guard the change with ctx.patched(...)",
            )
        self._seq += 1
        return seq

    def unconsumed_history(self) -> NonDeterminismError | None:
        """The error to fail with if the function finished before replaying all of its
        recorded history (a deploy removed operations that this run already recorded)."""
        if self._seq >= self._history_length:
            return None
        recorded = self._steps.get(self._seq)
        what = f"{recorded.kind} {recorded.name!r}" if recorded else "an operation"
        return nondeterminism_error(
            self._claimed,
            position=self._seq,
            finding=f"the workflow finished at position {self._seq}, but the history records {what} "
            f"there ({self._history_length} operations in all)",
            remedy="Restore the removed code for running workflows or guard the change with ctx.patched(...)",
            recorded={"kind": recorded.kind, "name": recorded.name} if recorded else {},
            requested={"kind": "finish", "name": ""},
        )

    def _park(
        self,
        waiting_on: dict[str, Any],
        steps: list[StepWrite],
        timers: list[TimerWrite],
        *,
        wakes_on_messages: bool = True,
    ) -> NoReturn:
        self._frontier()
        if wakes_on_messages:
            waiting_on = self._messages.waking(waiting_on)
        waited = set(waiting_on.get("seqs") or []) if waiting_on.get("kind") == "activities" else set()
        background = self._activities.background(waited)
        if background:
            waiting_on = {**waiting_on, "background": background}
        held = self._activities.held(waited | set(background))
        if held:
            waiting_on = {**waiting_on, "held": held}
        keys = {(timer.seq, timer.kind) for timer in timers}
        timers = timers + [t for t in self._activities.background_timers if (t.seq, t.kind) not in keys]
        self._unwinding = Park(waiting_on, steps, timers)
        raise self._unwinding

    def _commit(self, step: StepWrite, write: Callable[..., None] | None = None, *extra: Any) -> None:
        """Record ``step`` with a fenced write: the store's ``commit_step``, or ``write`` (a
        fenced store method taking the step and ``extra``) for a step that also changes
        the run in the same transaction."""
        self._frontier()
        self._fence.flush()  # a step held back is recorded first, as if it had not been
        faults.hit("before_step_commit", run_id=self._claimed.run_id, seq=step.seq, engine=self._engine)
        if write is None:
            self._fence.write(self._engine.store.commit_step, step)
        else:
            self._fence.write(write, step, *extra)
        faults.hit("after_step_commit", run_id=self._claimed.run_id, seq=step.seq, engine=self._engine)

    def _commit_later(self, step: StepWrite, *, rides: bool = False) -> None:
        """Record ``step`` with the turn's next write, or in the run's terminal commit if
        the workflow returns before another (:meth:`Fence.hold`): an inline activity's
        completion, the last write of many a run. ``rides``: it may wait past the next
        operations for a later write (a sleep's end)."""
        self._frontier()
        faults.hit("before_step_commit", run_id=self._claimed.run_id, seq=step.seq, engine=self._engine)
        self._fence.hold(step, rides=rides)

    def _step_written(self, step: StepWrite) -> None:
        faults.hit("after_step_commit", run_id=self._claimed.run_id, seq=step.seq, engine=self._engine)

    def _step(
        self,
        seq: int,
        kind: str,
        name: str,
        status: str,
        *,
        args_json: str | None = None,
        result_json: str | None = None,
        error: dict[str, Any] | None = None,
        attempt: int = 1,
        started_at: datetime | None = None,
        finished: bool = True,
        failed_attempts: Sequence[dict[str, Any]] = (),
    ) -> StepWrite:
        now = self._db_now()
        return StepWrite(
            seq=seq,
            kind=kind,
            name=name,
            status=status,
            args_json=args_json,
            result_json=result_json,
            error_json=codec.dumps(error) if error is not None else None,
            attempt=attempt,
            started_at=started_at or now,
            finished_at=now if finished else None,
            failed_attempts_json=codec.dumps(list(failed_attempts)) if failed_attempts else None,
        )

    def _remember(self, step: StepWrite, result: Any, error: dict[str, Any] | None) -> None:
        """Keep this turn's view of a step it rewrote (queued steps change under it)."""
        self._steps[step.seq] = StepRecord(
            seq=step.seq,
            kind=step.kind,
            name=step.name,
            status=step.status,
            result=result,
            error=error,
            attempt=step.attempt,
            started_at=step.started_at,
            finished_at=step.finished_at,
            failed_attempts=tuple(codec.loads(step.failed_attempts_json))
            if step.failed_attempts_json
            else (),
        )

    # -- activities ----------------------------------------------------------------------

    def run(self, target: Activity[..., T] | Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run an activity (or a plain callable) once; its result is recorded and replayed.

        Retries follow the activity's policy. Raises :class:`ActivityFailed` when it fails
        for good; the workflow may catch that.
        """
        result: T = self._activities.run(as_activity(target), args, kwargs)
        return result

    @staticmethod
    def activity_info() -> ActivityInfo:
        """Inside an activity: the running attempt's :class:`ActivityInfo`."""
        return activity_info()

    def start(
        self, target: Activity[..., T] | Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> ActivityHandle[T]:
        """Start an activity and return a handle without waiting for it.

        A queued activity (``@activity(queue=...)``) is sent to its queue at once, so
        several started activities run in parallel on the workers. An inline activity
        runs here and now, before ``start`` returns. Wait with ``handle.result()``,
        :meth:`wait_all` or :meth:`wait_any`.
        """
        handle: ActivityHandle[T] = self._activities.start(as_activity(target), args, kwargs)
        return handle

    def wait_all(self, handles: Sequence[Handle]) -> list[Any]:
        """Wait until every handle has finished; return their results in order.

        If any failed, raises the :class:`ActivityFailed` of the first failed handle in
        the list (after all have finished, so replay always sees the same outcome)."""
        return waits.wait_all(self, handles)

    def wait_any(self, handles: Sequence[Handle]) -> Handle:
        """Wait until at least one handle has finished and return the first finished one
        (in list order). Which one it was is recorded, so replay returns the same."""
        return waits.wait_any(self, handles)

    # -- timers ------------------------------------------------------------------------

    def sleep(self, duration: Duration) -> None:
        """Sleep durably: the run parks and a timer wakes it, across restarts."""
        seconds = parse_duration(duration, what="ctx.sleep duration")
        durable_sleep(self, lambda now: now + timedelta(seconds=seconds))

    def sleep_until(self, moment: datetime) -> None:
        """Sleep durably until ``moment`` (an aware datetime)."""
        if not isinstance(moment, datetime) or moment.tzinfo is None:
            raise TypeError("ctx.sleep_until takes a timezone-aware datetime")
        durable_sleep(self, lambda _now: moment)

    # -- child workflows -----------------------------------------------------------------

    def start_child(
        self,
        workflow: Any,
        /,
        *args: Any,
        id: str | None = None,
        parent_close_policy: str = "terminate",
        **kwargs: Any,
    ) -> ChildHandle[Any]:
        """Start a child workflow (a registered name or a ``@workflow`` object) and return
        its handle at once; ``handle.result()`` waits durably for it. Its workflow id is
        ``id``, or ``"<this workflow id>:<position>"``.

        ``parent_close_policy`` says what happens to the child if it is still running
        when this run closes (completes, fails, is cancelled or times out):
        ``"terminate"`` (default) and ``"request_cancel"`` cancel it, ``"abandon"`` leaves
        it running. ``id`` and ``parent_close_policy`` are keywords of this call, not of
        the child workflow."""
        return start_child(self, workflow, args, kwargs, id=id, parent_close_policy=parent_close_policy)

    def run_child(
        self,
        workflow: Any,
        /,
        *args: Any,
        id: str | None = None,
        parent_close_policy: str = "terminate",
        **kwargs: Any,
    ) -> Any:
        """Start a child workflow and wait for its result (see :meth:`start_child`)."""
        handle = self.start_child(workflow, *args, id=id, parent_close_policy=parent_close_policy, **kwargs)
        return handle.result()

    # -- messages: signals, updates, queries -----------------------------------------------

    def on_signal(self, name: str, handler: Callable[[Any], Any]) -> None:
        """Call ``handler(payload)`` for each signal ``name`` the run receives, in arrival
        order, while the workflow is blocked (sleeping or waiting). Each application is
        recorded at a position of the history and repeated on replay, so the handler's
        changes to workflow state are deterministic. It may run inline activities; an
        exception it raises propagates into the workflow at the blocking operation."""
        self._messages.on_signal(name, handler)

    def on_update(self, name: str, handler: Callable[[Any], Any], validator: Any = None) -> None:
        """Answer update ``name`` with ``handler(payload)``; its return value (JSON) is the
        update's result. ``validator`` checks the payload before anything is stored: a
        callable that raises, a DRF ``Serializer`` class or a pydantic model. The handler
        runs while the workflow is blocked, at a recorded position; it may run inline
        activities but may not sleep or wait. An exception fails the update, not the run."""
        self._messages.on_update(name, handler, validator)

    def on_query(self, name: str, handler: Callable[..., Any]) -> None:
        """Answer query ``name`` with ``handler(*args)`` (JSON). Queries replay the recorded
        history read-only and call the handler; they never run activities or write."""
        self._messages.on_query(name, handler)

    def registered(self, kind: str) -> list[str]:
        """The names of the ``"signal"``, ``"update"`` or ``"query"`` handlers registered so far."""
        return self._messages.registered(kind)

    def wait_signal(self, name: str, timeout: Duration | None = None) -> Any:
        """Wait durably for signal ``name`` and return its payload. Signals are buffered:
        one sent before the workflow gets here is returned at once, and each signal is
        consumed by one wait, oldest first. With ``timeout`` (seconds or a duration
        string), raises :class:`SignalTimeout` once it has passed, across restarts."""
        return self._messages.wait_signal(name, timeout)

    def wait_condition(self, predicate: Callable[[], Any], timeout: Duration | None = None) -> bool:
        """Wait durably until ``predicate()`` is true; it is evaluated now and again after
        each signal or update handler applied while waiting. Returns ``True`` once it
        holds, or ``False`` when ``timeout`` (seconds or a duration string) passed first."""
        return self._messages.wait_condition(predicate, timeout)

    # -- recorded values ---------------------------------------------------------------

    def side_effect(self, fn: Callable[[], T], *, name: str | None = None) -> T:
        """Call ``fn`` once and record its (JSON) result; replay returns the recorded value."""
        label = name or f"{fn.__module__}.{getattr(fn, '__qualname__', repr(fn))}"
        seq, recorded = self._next(StepKind.SIDE_EFFECT, label)
        if recorded is not None:
            return recorded.result
        self._frontier()
        value, result_json = codec.roundtrip(fn(), what=f"the result of side effect {label}")
        self._commit(
            self._step(seq, StepKind.SIDE_EFFECT, label, StepStatus.COMPLETED, result_json=result_json)
        )
        return value

    def set_finalizer_state(self, value: Any) -> None:
        """Record ``value`` (JSON) for the workflow's finalizer (``@workflow(finalizer=...)``),
        which receives the last value set if the run ends cancelled or timed out."""
        seq, recorded = self._next(StepKind.SIDE_EFFECT, "finalizer_state")
        if recorded is not None:
            return
        self._frontier()
        state_json = codec.dumps(value, what="the finalizer state")
        step = self._step(
            seq, StepKind.SIDE_EFFECT, "finalizer_state", StepStatus.COMPLETED, result_json=state_json
        )
        self._fence.write(self._engine.store.set_finalizer_state, step, state_json)
        self._remember(step, codec.loads(state_json), None)

    def set_search_attributes(self, attributes: Mapping[str, Any]) -> None:
        """Merge ``attributes`` into this run's search attributes; a ``None`` value removes
        that attribute. Values are ``str``, ``int``, ``float``, ``bool``, or an aware
        ``datetime`` or a ``date`` (stored as ISO 8601 text: a datetime in UTC, ending in
        ``Z``). Names are letters, digits, ``_`` and ``-``; ``weft_...`` is reserved.

        Checked here: anything else raises :class:`InvalidInput` (a ``ValueError``) in the
        workflow, before anything is recorded. Recorded as one step whose commit also
        writes the run's attributes (both or neither, fenced like every step), so the run
        is found by the new values as soon as this returns, and replay does not write them
        again. An empty dict does nothing."""
        self._enter()
        values = check_search_attributes(attributes)
        if not values:
            return
        args_json = codec.dumps(values, what="the search attributes")
        name = step_name(values)
        seq, recorded = self._next(StepKind.SEARCH_ATTRIBUTES, name)
        if recorded is not None:
            return
        step = self._step(seq, StepKind.SEARCH_ATTRIBUTES, name, StepStatus.COMPLETED, args_json=args_json)
        self._commit(step, self._engine.store.set_search_attributes, values)

    def now(self) -> datetime:
        """The current time (UTC, by the database clock), recorded once."""
        return datetime.fromisoformat(
            self.side_effect(lambda: self._db_now().astimezone(UTC).isoformat(), name="now")
        )

    def uuid4(self) -> uuid.UUID:
        """A random UUID, recorded once."""
        return uuid.UUID(self.side_effect(lambda: str(uuid.uuid4()), name="uuid4"))

    def random(self) -> float:
        """A random float in [0, 1), recorded once."""
        return float(self.side_effect(_random.random, name="random"))

    def patched(self, change_id: str) -> bool:
        """``True`` where the new code path may run: new runs, and old runs that reach this
        point after the change shipped. Records a marker so later replays agree."""
        if change_id in self._patches:
            return self._patches[change_id]
        self._enter()
        recorded = self._steps.get(self._seq)
        if recorded is None:
            self._seq += 1
            self._commit(self._step(self._seq - 1, StepKind.PATCH, change_id, StepStatus.COMPLETED))
            answer = True
        elif recorded.kind == StepKind.PATCH and recorded.name == change_id:
            self._seq += 1
            answer = True
        else:
            # This run passed this point under the old code: keep the old path.
            answer = False
        self._patches[change_id] = answer
        return answer

    def continue_as_new(self, *args: Any, **kwargs: Any) -> None:
        """Finish this run as ``continued`` and start a fresh run of the same workflow id."""
        self._forbid_in_handler("continue as new")
        self._enter()
        self._unwinding = ContinueAsNew(args, kwargs)
        raise self._unwinding
