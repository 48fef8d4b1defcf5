"""The tracing observer: the observation points (:mod:`django_weft.engine.observe`) as
OpenTelemetry spans.

Every span is made from a point that fires once per real event, so a step replayed from
its record makes none. The spans of a run descend from the context its start stored
(:mod:`.propagation`): a turn's span is a child of the start, an inline attempt's a child
of its turn, a queued attempt's a child of the start (its turn may be long over, and ran
elsewhere). A signal or update sender's span is linked from the turn that receives it."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from .. import __version__
from ..engine.observe import (
    AttemptOutcome,
    AttemptScope,
    Carrier,
    FireScope,
    MessageScope,
    Observer,
    StartScope,
    TurnScope,
)
from .propagation import context_of, current_carrier, span_context_of

TRACER_NAME = "django_weft"

# The attributes every span of a run may carry (docs/how-to/observe.md#traces-opentelemetry).
WORKFLOW = "weft.workflow"
WORKFLOW_ID = "weft.workflow_id"
RUN_ID = "weft.run_id"
SEQ = "weft.seq"
ATTEMPT = "weft.attempt"
EPOCH = "weft.epoch"
QUEUE = "weft.queue"
OUTCOME = "weft.outcome"
DEPOSED = "weft.deposed"
TAKEOVER = "weft.takeover"

SCHEDULE_ID = "weft.schedule_id"
NAME = "weft.name"
MESSAGE = "weft.message"
CREATED = "weft.created"
TIMER_KIND = "weft.timer.kind"

SPANS = (
    "weft.start",
    "weft.turn",
    "weft.activity",
    "weft.signal",
    "weft.update",
    "weft.query",
    "weft.timer",
    "weft.schedule.fire",
)
"""The span names, each followed by the workflow, activity or message name where it has one."""
ATTRIBUTES = (
    WORKFLOW, WORKFLOW_ID, RUN_ID, SEQ, ATTEMPT, EPOCH, QUEUE, OUTCOME, DEPOSED, TAKEOVER,
    SCHEDULE_ID, NAME, MESSAGE, CREATED, TIMER_KIND,
)  # fmt: skip
"""Every attribute the spans may carry."""

# Turn outcomes that are failures of the run, reported as the span's ERROR status.
_FAILED_TURNS = {"failed", "error", "deposed"}
# Attempt outcomes whose recorded error is the span's ERROR status.
_FAILED_ATTEMPTS = {
    AttemptOutcome.FAILED,
    AttemptOutcome.RETRIED,
    AttemptOutcome.ATTEMPT_FAILED,
    AttemptOutcome.DEPOSED,
    "error",
}


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


class TracingObserver(Observer):
    """Spans ``weft.start``, ``weft.turn``, ``weft.activity``, ``weft.signal``,
    ``weft.update``, ``weft.query``, ``weft.timer`` and ``weft.schedule.fire``, from the
    tracer the application's provider gives (looked up at the first span, so a provider
    set after ``ready()`` is the one used)."""

    def __init__(self) -> None:
        self._tracer: trace.Tracer | None = None
        self._key = id(self)
        self._local = threading.local()

    @property
    def tracer(self) -> trace.Tracer:
        if self._tracer is None:
            # The API's proxy tracer follows the global provider once the application
            # sets it, so caching it here never pins the no-op one.
            self._tracer = trace.get_tracer(TRACER_NAME, __version__)
        return self._tracer

    def _open(self, scope: Any, span: Span) -> None:
        """Make ``span`` current for the scope's block (its children's parent)."""
        token = otel_context.attach(trace.set_span_in_context(span))
        scope.state[self._key] = (span, token)

    def _close(self, scope: Any) -> Span | None:
        opened = scope.state.pop(self._key, None)
        if opened is None:
            return None
        span, token = opened
        otel_context.detach(token)
        return span

    # -- starts ---------------------------------------------------------------------------

    def start_began(self, scope: StartScope) -> None:
        span = self.tracer.start_span(
            f"weft.start {scope.workflow}", kind=SpanKind.PRODUCER, attributes={WORKFLOW: scope.workflow}
        )
        # Current until the start returns: the run stores this span's context (below).
        self._open(scope, span)

    def fill_carrier(self, carrier: Carrier) -> None:
        # The current context: a start's span, a sender's weft.signal or weft.update span,
        # or the turn of a workflow starting a child.
        carrier.update(current_carrier() or {})

    def start_ended(self, scope: StartScope) -> None:
        span = self._close(scope)
        if span is None:
            return
        if scope.run_id:
            span.set_attribute(RUN_ID, scope.run_id)
            span.set_attribute(WORKFLOW_ID, scope.workflow_id or "")
            span.set_attribute(CREATED, bool(scope.created))
        _end(span, scope.exception)

    # -- turns ----------------------------------------------------------------------------

    def turn_started(self, scope: TurnScope) -> None:
        claimed = scope.claimed
        span = self.tracer.start_span(
            f"weft.turn {claimed.workflow_name}",
            context=context_of(claimed.trace_context),
            kind=SpanKind.CONSUMER,
            attributes={
                WORKFLOW: claimed.workflow_name,
                WORKFLOW_ID: claimed.workflow_id,
                RUN_ID: claimed.run_id,
                EPOCH: claimed.epoch,
                TAKEOVER: scope.takeover,
            },
        )
        self._open(scope, span)

    def turn_finished(self, scope: TurnScope) -> None:
        span = self._close(scope)
        if span is None:
            return
        span.set_attribute(OUTCOME, scope.outcome)
        if scope.outcome == "deposed":
            _deposed(span, scope.claimed.epoch)
        elif scope.outcome in _FAILED_TURNS and scope.exception is None:
            span.set_status(Status(StatusCode.ERROR, f"the run {scope.outcome}"))
        _end(span, scope.exception)

    def deposed_write(self, *, run_id: str, engine_id: str, epoch: int) -> None:
        # The current span is the turn's, or an inline attempt's in it: the writer deposed.
        _deposed(trace.get_current_span(), epoch)

    def message_delivered(self, *, run_id: str, kind: str, name: str, carrier: Carrier | None) -> None:
        # A signal or update a turn really consumes or applies (not one replayed from its
        # record): its turn's span links to the sender's.
        sender = span_context_of(carrier)
        if sender is not None:
            trace.get_current_span().add_link(sender, {MESSAGE: kind, NAME: name})

    # -- activity attempts --------------------------------------------------------------------

    def attempt_started(self, scope: AttemptScope) -> None:
        info = scope.info
        attributes: dict[str, Any] = {
            WORKFLOW: info.workflow_name,
            WORKFLOW_ID: info.workflow_id,
            RUN_ID: info.run_id,
            SEQ: info.seq,
            ATTEMPT: info.attempt,
        }
        if scope.epoch is not None:
            attributes[EPOCH] = scope.epoch
        name = f"weft.activity {info.activity_name}"
        if scope.inline:
            # A child of its turn's span, the current one.
            span = self.tracer.start_span(name, attributes=attributes)
        else:
            # A child of the run's start, like the turns (the turn that scheduled it has
            # ended, elsewhere).
            attributes[QUEUE] = scope.queue or "default"
            span = self.tracer.start_span(
                name, context=context_of(scope.carrier), kind=SpanKind.CONSUMER, attributes=attributes
            )
        self._open(scope, span)

    def attempt_finished(self, scope: AttemptScope) -> None:
        span = self._close(scope)
        if span is None:
            return
        span.set_attribute(OUTCOME, scope.outcome)
        if scope.outcome == AttemptOutcome.DEPOSED:
            _deposed(span, scope.epoch)
        elif scope.outcome in _FAILED_ATTEMPTS and scope.exception is None:
            _recorded_error(span, scope.error)
        _end(span, scope.exception)

    # -- messages -------------------------------------------------------------------------

    def message_started(self, scope: MessageScope) -> None:
        span = self.tracer.start_span(
            f"weft.{scope.kind} {scope.name}",
            kind=SpanKind.PRODUCER if scope.kind != "query" else SpanKind.INTERNAL,
            attributes={NAME: scope.name},
        )
        # Current until the message is stored: the message stores this span's context.
        self._open(scope, span)

    def message_finished(self, scope: MessageScope) -> None:
        span = self._close(scope)
        if span is None:
            return
        if scope.run_id:
            span.set_attribute(RUN_ID, scope.run_id)
        if scope.workflow:
            span.set_attribute(WORKFLOW, scope.workflow)
        span.set_attribute(OUTCOME, scope.outcome)
        _end(span, scope.exception)

    # -- the sweep --------------------------------------------------------------------------

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
        # From when it was due to when it fired: the span's length is the sweep's lateness.
        # A child of the run's start, like its turns (the trace of the code that started it).
        span = self.tracer.start_span(
            "weft.timer",
            context=context_of(carrier),
            start_time=_ns(fire_at if fire_at is not None and fire_at <= fired_at else fired_at),
            attributes={RUN_ID: run_id, SEQ: seq, TIMER_KIND: kind},
        )
        span.end(end_time=_ns(fired_at))

    def fire_began(self, scope: FireScope) -> None:
        # Current while the fire starts its run: the run's weft.start is its child.
        span = self.tracer.start_span(
            "weft.schedule.fire", attributes={SCHEDULE_ID: scope.schedule_id, WORKFLOW: scope.workflow}
        )
        self._open(scope, span)
        self._fires().append(span)

    def fire_ended(self, scope: FireScope) -> None:
        span = self._close(scope)
        if span is None:
            return
        self._fires().remove(span)
        _end(span, scope.exception)

    def schedule_fired(self, *, schedule_id: str, workflow: str, outcome: str, run_id: str | None) -> None:
        attributes = {SCHEDULE_ID: schedule_id, WORKFLOW: workflow, OUTCOME: outcome}
        if run_id:
            attributes[RUN_ID] = run_id
        fires = self._fires()
        if fires:  # a fire that started a run: its span is open (fire_began)
            fires[-1].set_attributes(attributes)
            if outcome == "error":
                fires[-1].set_status(Status(StatusCode.ERROR, "the fire could not start its run"))
            return
        # Skipped, buffered, missed: no run started, a span of its own.
        self.tracer.start_span("weft.schedule.fire", attributes=attributes).end()

    def _fires(self) -> list[Span]:
        """This thread's open fire spans (a fire runs in the thread of its tick)."""
        fires: list[Span] | None = getattr(self._local, "fires", None)
        if fires is None:
            fires = self._local.fires = []
        return fires


def _deposed(span: Span, epoch: int | None) -> None:
    span.set_attribute(DEPOSED, True)
    span.set_status(
        Status(StatusCode.ERROR, f"deposed: epoch {epoch} is no longer current; another owner has the run")
    )


def _recorded_error(span: Span, error: dict[str, Any] | None) -> None:
    """A failure the engine recorded (not raised here): an ``exception`` event with the
    recorded type and message, and the span's ERROR status."""
    error = error or {}
    kind, message = str(error.get("type", "error")), str(error.get("message", ""))
    attributes = {"exception.type": kind, "exception.message": message}
    if error.get("traceback"):
        attributes["exception.stacktrace"] = str(error["traceback"])
    span.add_event("exception", attributes)
    span.set_status(Status(StatusCode.ERROR, f"{kind}: {message}" if message else kind))


def _end(span: Span, exception: BaseException | None) -> None:
    if exception is not None:
        span.record_exception(exception)
        span.set_status(Status(StatusCode.ERROR, f"{type(exception).__name__}: {exception}"))
    span.end()
