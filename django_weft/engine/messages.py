"""Message handling: signals, updates and queries, and their handlers.

Handlers registered with ``ctx.on_signal`` / ``ctx.on_update`` run while the workflow
body is blocked (sleeping, waiting for a signal, a condition, activities or a child).
Each application is recorded at the next position of the history, between the blocking
operation's start and its completion; a replay re-applies the recorded applications,
in their order, when the body reaches that operation again (see docs/explanation/decisions.md, 13).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from . import codec, faults, observe
from .attempt import describe_exception
from .durations import Duration, parse_duration
from .error_types import ErrorType
from .errors import (
    CancellationRequested,
    ConfigurationError,
    NonDeterminismError,
    SignalTimeout,
    UpdateValidationError,
)
from .parking import unknown_update_error
from .ports import get_payload_validator
from .records import (
    MessageKind,
    PendingMessage,
    StepKind,
    StepRecord,
    StepStatus,
    StepWrite,
    TimerKind,
    TimerWrite,
)

if TYPE_CHECKING:
    from .context import WorkflowContext

MAX_MESSAGE_NAME_LENGTH = 200
"""The longest signal, update or query name (the ``name`` columns hold 200 characters)."""

PASSED_ON = "cancellation_passed_on"
"""Set in an update's recorded outcome when the cancellation request its handler received
went on into the workflow: replay raises it there again. Histories recorded before it
was passed on (the handler kept it) lack it and replay as they ran."""

CANCEL_STEP_NAME = "cancel"
"""The ``name`` of a delivered cancellation request's history entry (kind ``cancel_request``)."""


def cancellation_requested(info: dict[str, Any], seq: int) -> CancellationRequested:
    """The exception a workflow receives for the cancellation request recorded at ``seq``
    (live and on replay alike)."""
    reason = info.get("reason")
    text = f"cancellation requested: {reason}" if reason else "cancellation requested"
    return CancellationRequested(
        f"{text} (received at position {seq})",
        reason=reason,
        requested_at=info.get("requested_at"),
        seq=seq,
    )


def check_message_name(name: Any, what: str) -> str:
    """A signal, update or query name: a non-empty string of at most 200 characters, with
    no control character or lone surrogate."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"{what} name must be a non-empty string; got {name!r}")
    if len(name) > MAX_MESSAGE_NAME_LENGTH:
        raise ConfigurationError(
            f"{what} name is {len(name)} characters long; the limit is {MAX_MESSAGE_NAME_LENGTH}"
        )
    flaw = codec.text_flaw(name)
    if flaw:
        raise ConfigurationError(f"{what} name must not contain {flaw}; got {name[:100]!r}")
    return name


@dataclass(frozen=True)
class UpdateHandler:
    """An update handler registered with :meth:`WorkflowContext.on_update`."""

    handler: Callable[[Any], Any]
    validator: Any = None


class BlockingStart:
    """The start record of a blocking operation not yet written: written before the
    first handler application recorded after it, or else with the park."""

    def __init__(self, ctx: WorkflowContext, step: StepWrite | None) -> None:
        self._ctx = ctx
        self._step = step

    def record(self) -> None:
        if self._step is not None:
            self._ctx._commit(self._step)
            self._step = None

    def unrecorded(self) -> list[StepWrite]:
        return [self._step] if self._step is not None else []


class MessageHandling:
    """One turn's message handlers (registered by the workflow as it runs; not recorded:
    every replay registers them again at the same points), the pending messages, and
    the waits for them."""

    def __init__(self, ctx: WorkflowContext) -> None:
        self._ctx = ctx
        self.signal_handlers: dict[str, Callable[[Any], Any]] = {}
        self.update_handlers: dict[str, UpdateHandler] = {}
        self.query_handlers: dict[str, Callable[..., Any]] = {}
        # Signals and updates waiting for this run, loaded once per turn when first needed.
        self._pending: list[PendingMessage] | None = None
        self._pending_fresh = False

    # -- registration ------------------------------------------------------------------

    def on_signal(self, name: str, handler: Callable[[Any], Any]) -> None:
        check_message_name(name, "signal")
        if not callable(handler):
            raise ConfigurationError(f"the handler of signal {name!r} must be callable; got {handler!r}")
        self.signal_handlers[name] = handler

    def on_update(self, name: str, handler: Callable[[Any], Any], validator: Any) -> None:
        check_message_name(name, "update")
        if not callable(handler):
            raise ConfigurationError(f"the handler of update {name!r} must be callable; got {handler!r}")
        if validator is not None and not callable(validator):
            raise ConfigurationError(
                f"the validator of update {name!r} must be a callable, a DRF Serializer class or a "
                f"pydantic model; got {validator!r}"
            )
        self.update_handlers[name] = UpdateHandler(handler, validator)

    def on_query(self, name: str, handler: Callable[..., Any]) -> None:
        check_message_name(name, "query")
        if not callable(handler):
            raise ConfigurationError(f"the handler of query {name!r} must be callable; got {handler!r}")
        self.query_handlers[name] = handler

    def registered(self, kind: str) -> list[str]:
        table: dict[str, dict[str, Any]] = {
            "signal": self.signal_handlers,
            "update": self.update_handlers,
            "query": self.query_handlers,
        }
        return sorted(table[kind])

    def waking(self, waiting_on: dict[str, Any]) -> dict[str, Any]:
        """``waiting_on`` with the signals and updates that must wake the parked run: the
        one it waits for and those it has handlers for (they run while it is blocked)."""
        signals = set(self.signal_handlers)
        if waiting_on.get("kind") == "signal":
            signals.add(waiting_on["name"])
        if signals:
            waiting_on = {**waiting_on, "signals": sorted(signals)}
        if self.update_handlers:
            waiting_on = {**waiting_on, "updates": sorted(self.update_handlers)}
        return waiting_on

    # -- waits for messages --------------------------------------------------------------

    def wait_signal(self, name: str, timeout: Duration | None) -> Any:
        ctx = self._ctx
        ctx._forbid_in_handler("wait for a signal")
        check_message_name(name, "signal")
        if name in self.signal_handlers:
            raise ConfigurationError(
                f"signal {name!r} has a handler (ctx.on_signal), which consumes every such signal; "
                "wait for it with ctx.wait_condition on state the handler sets, or use another name"
            )
        seconds = parse_duration(timeout, what="ctx.wait_signal timeout") if timeout is not None else None
        seq, recorded = ctx._next(StepKind.SIGNAL, name)
        self.replay_handlers()
        if recorded is not None and recorded.status == StepStatus.COMPLETED:
            return _signal_outcome(name, seq, recorded.result or {})
        started_at, fire_at, waiting, start = self._wait_start(seq, StepKind.SIGNAL, name, recorded, seconds)
        taken, _ = self.deliver(
            take=lambda message: message.kind == MessageKind.SIGNAL and message.name == name,
            before=start.record,
            at=seq,
        )
        if taken is not None:
            result = {"signal": taken.pk, "payload": taken.payload}
            self._finish_wait(seq, StepKind.SIGNAL, name, result, started_at, signal_pk=taken.pk)
            return taken.payload
        if fire_at is not None and fire_at <= ctx._db_now():
            result = {**waiting, "timed_out": True}
            self._finish_wait(seq, StepKind.SIGNAL, name, result, started_at)
            return _signal_outcome(name, seq, result)
        return ctx._park(*_message_park({"kind": "signal", "seq": seq, "name": name}, seq, fire_at, start))

    def wait_condition(self, predicate: Callable[[], Any], timeout: Duration | None) -> bool:
        ctx = self._ctx
        ctx._forbid_in_handler("wait for a condition")
        if not callable(predicate):
            raise ConfigurationError(f"ctx.wait_condition takes a callable predicate; got {predicate!r}")
        seconds = parse_duration(timeout, what="ctx.wait_condition timeout") if timeout is not None else None
        seq, recorded = ctx._next(StepKind.CONDITION, "wait_condition")
        self.replay_handlers()
        if recorded is not None and recorded.status == StepStatus.COMPLETED:
            return bool((recorded.result or {}).get("satisfied"))
        started_at, fire_at, waiting, start = self._wait_start(
            seq, StepKind.CONDITION, "wait_condition", recorded, seconds
        )
        self.deliver_cancellation(start.record, seq)
        satisfied = bool(predicate())
        if not satisfied:
            _, satisfied = self.deliver(done=lambda: bool(predicate()), before=start.record, at=seq)
        timed_out = not satisfied and fire_at is not None and fire_at <= ctx._db_now()
        if satisfied or timed_out:
            result = {**waiting, "satisfied": satisfied}
            self._finish_wait(seq, StepKind.CONDITION, "wait_condition", result, started_at)
            return satisfied
        return bool(ctx._park(*_message_park({"kind": "condition", "seq": seq}, seq, fire_at, start)))

    def _wait_start(
        self, seq: int, kind: str, name: str, recorded: StepRecord | None, seconds: float | None
    ) -> tuple[datetime, datetime | None, dict[str, Any], BlockingStart]:
        """When a signal or condition wait started and when it times out (from its record,
        or now), and its start record, written once before any handler step after it."""
        ctx = self._ctx
        now = ctx._db_now()
        if recorded is not None:
            fire_at_text = (recorded.result or {}).get("fire_at")
            started_at = recorded.started_at or now
            fire_at = datetime.fromisoformat(fire_at_text) if fire_at_text else None
        else:
            started_at = now
            fire_at = now + timedelta(seconds=seconds) if seconds is not None else None
        waiting = {"fire_at": fire_at.isoformat() if fire_at else None}
        step = None
        if recorded is None:
            step = ctx._step(
                seq, kind, name, StepStatus.WAITING, result_json=codec.dumps(waiting), finished=False
            )
        return started_at, fire_at, waiting, BlockingStart(ctx, step)

    def _finish_wait(
        self,
        seq: int,
        kind: str,
        name: str,
        result: dict[str, Any],
        started_at: datetime | None = None,
        *,
        signal_pk: int | None = None,
    ) -> None:
        """Record a message wait's (or a signal handler's) completed step, consuming
        ``signal_pk`` and removing the wait's timeout timer in the same fenced transaction."""
        ctx = self._ctx
        step = ctx._step(
            seq, kind, name, StepStatus.COMPLETED, result_json=codec.dumps(result), started_at=started_at
        )
        ctx._frontier()
        ctx._fence.write(ctx._engine.store.finish_wait, step, signal_pk=signal_pk)
        ctx._remember(step, codec.loads(step.result_json) if step.result_json else None, None)

    # -- applying handlers ---------------------------------------------------------------

    def replay_handlers(self) -> None:
        """Re-apply the handler applications recorded at the current position: they ran
        while the body was blocked at the operation it has just reached, so they change
        the workflow's state before that operation returns, as they did the first time.

        A cancellation request recorded after them is raised again here: the operation
        the body has reached is the one that received it."""
        ctx = self._ctx
        while True:
            recorded = ctx._steps.get(ctx._seq)
            if recorded is not None and recorded.kind == StepKind.CANCEL_REQUEST:
                ctx._seq += 1
                raise cancellation_requested(recorded.result or {}, recorded.seq)
            if recorded is None or recorded.kind != StepKind.HANDLER:
                return
            self._apply_recorded(recorded)

    def deliver_cancellation(self, before: Callable[[], None] | None, at: int | None) -> None:
        """At a blocking point: if a cancellation request is pending, receive it here.

        Every blocking operation the workflow reaches past its recorded history calls
        this first, before it looks whether it could return at once (a sleep whose time
        has come, a buffered signal, a finished activity): a request is received at the
        first blocking call after it was stored, whatever else happened meanwhile.

        Its history entry is recorded at the next position (after the blocking operation's
        start, which ``before`` records, and the handler applications before it) in one
        fenced transaction that also marks the request delivered and removes the timers of
        the blocking operation at position ``at`` (a sleep's, a wait's timeout, a retry's).
        Then :class:`CancellationRequested` is raised into the workflow. A crash before
        that commit leaves the request pending for the next owner; after it, replay
        raises it from the history and the request is not delivered again."""
        ctx = self._ctx
        request = ctx._cancel_request
        if request is None or ctx.is_replaying:
            # Replaying, the operation is one the workflow passed before the request came.
            return
        if before is not None:
            before()
        seq = ctx._handler_position()
        info = {"reason": request.reason, "requested_at": request.requested_at}
        step = ctx._step(
            seq,
            StepKind.CANCEL_REQUEST,
            CANCEL_STEP_NAME,
            StepStatus.COMPLETED,
            result_json=codec.dumps(info),
        )
        faults.hit("before_cancel_delivery", run_id=ctx._claimed.run_id, seq=seq, engine=ctx._engine)
        ctx._commit(step, ctx._engine.store.deliver_cancel_request, replace(request, seq=seq), at)
        ctx._cancel_request = None
        ctx._remember(step, info, None)
        ctx.logger.info("cancellation requested%s; raised at position %s",
                        f" ({request.reason})" if request.reason else "", seq)  # fmt: skip
        raise cancellation_requested(info, seq)

    def _pending_messages(self, refresh: bool) -> list[PendingMessage]:
        if self._pending is None or refresh:
            self._pending = list(self._ctx._engine.store.pending_messages(self._ctx._claimed.run_id))
            self._pending_fresh = True
        return self._pending

    def deliver(
        self,
        *,
        take: Callable[[PendingMessage], bool] | None = None,
        done: Callable[[], bool] | None = None,
        before: Callable[[], None] | None = None,
        at: int | None = None,
    ) -> tuple[PendingMessage | None, bool]:
        """While blocked: receive a pending cancellation request (raising it, see
        :meth:`deliver_cancellation`; ``at`` is the blocking operation's position), else
        apply pending signals and updates to their handlers, in arrival order. Stops at
        the first message ``take`` accepts (returned, for the caller to consume) or once
        ``done()`` holds after a handler (then ``(None, True)``). ``before`` runs once,
        before the first entry after the blocking operation's start is recorded.

        The messages are read once per turn; before giving up they are read again, so a
        message that arrived during the turn is seen. One that arrives after that wakes
        the run when it parks (the park and the message's insert lock the same row); so
        does a cancellation request that arrives after the claim read the run."""
        if self._ctx._read_only:
            return None, False
        self.deliver_cancellation(before, at)
        if take is None and not self.signal_handlers and not self.update_handlers:
            return None, False
        fresh_read = False
        while True:
            messages = self._pending_messages(refresh=fresh_read)
            fresh_read = fresh_read or self._pending_fresh
            self._pending_fresh = False
            for message in list(messages):
                if take is not None and take(message):
                    messages.remove(message)
                    self._delivered(message)
                    return message, False
                if message.kind == MessageKind.SIGNAL and message.name not in self.signal_handlers:
                    continue  # buffered for a later wait_signal or handler
                if before is not None:
                    before()
                    before = None
                messages.remove(message)
                self._delivered(message)
                self._apply_live(message)
                if done is not None and done():
                    return None, True
            if fresh_read:
                return None, False
            fresh_read = True

    def _delivered(self, message: PendingMessage) -> None:
        """Say that this turn takes ``message`` for real (a replayed one never gets here)."""
        observe.message_delivered(
            run_id=self._ctx._claimed.run_id,
            kind=message.kind,
            name=message.name,
            carrier=message.trace_context,
        )

    def _apply_live(self, message: PendingMessage) -> None:
        """Apply one pending message at the next position, recording it first."""
        ctx = self._ctx
        if message.kind == MessageKind.SIGNAL:
            seq = ctx._handler_position()
            info = {"signal": message.pk, "payload": message.payload}
            self._finish_wait(seq, StepKind.HANDLER, f"signal:{message.name}", info, signal_pk=message.pk)
            self._call_signal_handler(message.name, message.payload)
            return
        entry = self.update_handlers.get(message.name)
        if entry is None:
            # The run blocks here without this handler: an update accepted before the run
            # had registered its handlers (or against code that has since changed) is
            # answered as unknown instead of leaving the caller waiting.
            error = unknown_update_error(message.name, self.update_handlers)
            ctx._fence.write(ctx._engine.store.fail_update, message.pk, error)
            return
        if not message.validated and entry.validator is not None:
            # Accepted before the handler existed: its validator runs now, before the
            # update is applied, and a rejection is answered without applying it.
            try:
                get_payload_validator()(
                    entry.validator, message.payload, what=f"the validator of update {message.name!r}"
                )
            except UpdateValidationError as exc:
                rejected = {
                    "type": ErrorType.UPDATE_REJECTED,
                    "message": exc.message,
                    "issues": list(getattr(exc, "issues", [])),
                }
                ctx._fence.write(ctx._engine.store.fail_update, message.pk, rejected)
                return
        seq = ctx._handler_position()
        info = {"update": message.pk, "update_id": message.update_id, "payload": message.payload}
        step = ctx._step(
            seq,
            StepKind.HANDLER,
            f"update:{message.name}",
            StepStatus.WAITING,
            result_json=codec.dumps(info),
            finished=False,
        )
        faults.hit("before_update_apply", run_id=ctx._claimed.run_id, seq=seq, engine=ctx._engine)
        ctx._fence.write(ctx._engine.store.apply_update, step, message.pk)
        ctx._remember(step, info, None)
        self._finish_update(seq, message.name, entry, info, step.started_at)

    def _apply_recorded(self, recorded: StepRecord) -> None:
        """Replay one recorded handler application (its inner steps replay as usual)."""
        ctx = self._ctx
        seq = ctx._seq
        ctx._seq += 1
        kind, _, name = recorded.name.partition(":")
        info = dict(recorded.result or {})
        table: dict[str, Any] = self.signal_handlers if kind == MessageKind.SIGNAL else self.update_handlers
        if name not in table:
            ctx._diverged(
                recorded,
                f"at position {seq} the history records the {kind} handler {name!r}, but the code "
                f"has no such handler registered there (it has: {', '.join(sorted(table)) or 'none'})",
                "Register the handler before the point where the workflow blocks, as the code that "
                "recorded it did",
            )
        if kind == MessageKind.SIGNAL:
            self._call_signal_handler(name, info.get("payload"))
        elif recorded.status == StepStatus.COMPLETED:
            _, _, cancelled = self._call_update_handler(name, table[name], info.get("payload"))  # its effects
            if cancelled is not None and (info.get("outcome") or {}).get(PASSED_ON):
                raise cancelled  # as it was: a history recorded before it was passed on kept it
        else:
            # Applied, but the turn ended before the outcome was recorded: finish it now.
            info.pop("outcome", None)
            self._finish_update(seq, name, table[name], info, recorded.started_at)

    def _call_signal_handler(self, name: str, payload: Any) -> None:
        ctx = self._ctx
        previous, ctx._in_handler = ctx._in_handler, f"handler of signal {name!r}"
        try:
            self.signal_handlers[name](payload)
        finally:
            ctx._in_handler = previous

    def _call_update_handler(
        self, name: str, entry: UpdateHandler, payload: Any
    ) -> tuple[bool, Any, CancellationRequested | None]:
        """Run an update handler: ``(True, JSON value, None)`` or ``(False, error
        description, cancellation)``.

        A cancellation request the handler received (at its activity's durable retry, the
        one blocking point a handler may reach) fails the update and is returned, for the
        caller to raise into the workflow once the update's outcome is recorded: the
        request is the workflow's, and the handler ran at the workflow's blocking point."""
        ctx = self._ctx
        previous, ctx._in_handler = ctx._in_handler, f"handler of update {name!r}"
        try:
            value = entry.handler(payload)
            return True, codec.roundtrip(value, what=f"the result of update {name}")[0], None
        except NonDeterminismError:
            raise  # the run is held for a fix; the update stays applied and unanswered
        except Exception as exc:
            if ctx._fatal is not None:
                raise ctx._fatal from None
            cancelled = exc if isinstance(exc, CancellationRequested) else None
            return False, describe_exception(exc), cancelled
        finally:
            ctx._in_handler = previous

    def _finish_update(
        self, seq: int, name: str, entry: UpdateHandler, info: dict[str, Any], started_at: datetime | None
    ) -> None:
        ctx = self._ctx
        ok, value, cancelled = self._call_update_handler(name, entry, info.get("payload"))
        ctx._frontier()
        ctx._fence.flush()  # the handler's own steps are recorded before its answer
        faults.hit("before_update_answer", run_id=ctx._claimed.run_id, seq=seq, engine=ctx._engine)
        outcome = {"ok": True, "result": value} if ok else {"ok": False, "error": value}
        if cancelled is not None:
            outcome[PASSED_ON] = True
        step = ctx._step(
            seq,
            StepKind.HANDLER,
            f"update:{name}",
            StepStatus.COMPLETED,
            result_json=codec.dumps({**info, "outcome": outcome}),
            started_at=started_at,
        )
        ctx._fence.write(
            ctx._engine.store.answer_update,
            step,
            int(info["update"]),
            ok=ok,
            result_json=codec.dumps(value) if ok else None,
            error_json=None if ok else codec.dumps(value),
        )
        ctx._remember(step, {**info, "outcome": outcome}, None)
        if cancelled is not None:
            raise cancelled


def _signal_outcome(name: str, seq: int, result: dict[str, Any]) -> Any:
    if result.get("timed_out"):
        raise SignalTimeout(
            f"no signal {name!r} arrived before {result.get('fire_at')} (ctx.wait_signal at position {seq})",
            name=name,
            seq=seq,
        )
    return result.get("payload")


def _message_park(
    wait: dict[str, Any], seq: int, fire_at: datetime | None, start: BlockingStart
) -> tuple[dict[str, Any], list[StepWrite], list[TimerWrite]]:
    """What a message wait parks with: its wait record, its unwritten start, its timeout timer."""
    if fire_at is None:
        return wait, start.unrecorded(), []
    return (
        {**wait, "fire_at": fire_at.isoformat()},
        start.unrecorded(),
        [TimerWrite(seq, TimerKind.SIGNAL_TIMEOUT, fire_at)],
    )
