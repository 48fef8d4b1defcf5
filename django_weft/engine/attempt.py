"""One attempt of an activity: :func:`call_activity`, the one path an attempt takes,
inline (in a workflow turn) or queued (on a worker). It sets :func:`activity_info`, calls
the function, encodes its result and, on failure, decides with :func:`is_retryable`
whether another attempt may follow; :func:`admit_attempt` asks flow control first. The
workflow's side of activities (replaying, retrying and queueing attempts) is
:mod:`.activities`.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import traceback
import uuid
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from . import activity_overrides, codec, run_logging
from .error_types import ErrorType
from .errors import ActivityFailed, CancellationRequested, PayloadError
from .flow import Hold, HoldKind, Rate, activity_flow_keys, reservation_stands
from .ports import get_coroutine_runner
from .records import (
    TERMINAL_STATUSES,
    CancelRequest,
    StepRecord,
    failed_attempt,
)
from .registry import Activity
from .retry import RetryPolicy
from .run_logging import get_logger

if TYPE_CHECKING:
    from .ports import TurnStore

T = TypeVar("T")

logger = get_logger("django_weft.engine")

MAX_REDISPATCH_DELAY = 600.0
"""The longest a queued attempt waits in its queue before it is sent again (seconds)."""


def cancellation_seen(status: str | None, request: CancelRequest | None, seq: int) -> str | None:
    """Why the activity at position ``seq`` of a run in ``status`` should stop, or ``None``:
    its run has a pending cancellation request, or received one at a later position (so
    after the activity started: a compensation step the workflow runs after receiving a
    request is not told to stop), or has finished (nothing will record the result)."""
    if status is None:
        return "the run no longer exists"
    if status in TERMINAL_STATUSES:
        return f"the run has finished ({status})"
    if request is None or not (request.pending or (request.seq is not None and request.seq > seq)):
        return None
    return f"cancellation requested: {request.reason}" if request.reason else "cancellation requested"


class CancelProbe:
    """How a running activity attempt learns that its run asked for cancellation: ``check``
    reads it now (returning why, or ``None``); the worker's lease heartbeat may also set
    ``why`` meanwhile. Once set it stays set."""

    def __init__(self, check: Callable[[], str | None] | None = None, why: str | None = None) -> None:
        self.check = check
        self.why = why

    def refresh(self) -> str | None:
        if self.why is None and self.check is not None:
            self.why = self.check()
        return self.why


@dataclass(frozen=True)
class ActivityInfo:
    """What an activity can learn about the call it is serving (see :func:`activity_info`)."""

    run_id: str
    workflow_id: str
    workflow_name: str
    activity_name: str
    seq: int
    attempt: int
    _probe: CancelProbe = field(default_factory=CancelProbe, compare=False, repr=False)
    worker: str = ""
    """The id of the worker (engine) running this attempt: ``"<host>:<pid>:<n>"``."""
    started_at: datetime | None = None
    """When this attempt started by the database's clock, as its step records it (an
    inline attempt's; ``None`` where this process did not time it: a queued one's)."""

    @property
    def log_fields(self) -> dict[str, Any]:
        """The ``extra`` of this attempt's log records (:mod:`~django_weft.engine.run_logging`)."""
        return {"run_id": self.run_id, "workflow_id": self.workflow_id, "workflow": self.workflow_name,
                "seq": self.seq, "attempt": self.attempt}  # fmt: skip

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger for the activity's code (``django_weft.activity.<name>``) whose records
        carry :attr:`log_fields` in ``extra``: ``logger = activity_info().logger``."""
        return run_logging.FieldsLogger(logging.getLogger(f"django_weft.activity.{self.activity_name}"),
                                        self.log_fields)  # fmt: skip

    @property
    def idempotency_key(self) -> str:
        """Stable across attempts and re-executions: ``"<run_id>:<seq>"``."""
        return f"{self.run_id}:{self.seq}"

    @property
    def cancel_requested(self) -> bool:
        """Whether this activity's run asked for cancellation while it runs (a pending
        cancellation request, one the workflow received after this activity started) or
        has finished (cancelled, timed out...: nothing will record this attempt's result),
        as last seen by :meth:`heartbeat` or, for a queued activity, by its worker's lease
        heartbeat (every ``WEFT_LEASE_RENEW_INTERVAL``). Cheap: it reads no database."""
        return self._probe.why is not None

    def heartbeat(self) -> None:
        """Check now (one database read) whether this activity should stop, and raise
        :class:`CancellationRequested` if so (see :attr:`cancel_requested`); return
        otherwise. Call it between chunks of a long activity. Let the exception propagate
        to stop: the attempt fails and is not retried.

        In an ``async def`` activity, prefer ``await`` :meth:`aheartbeat`; this one works
        there too, blocking the activity's event loop for the read."""
        if _loop_running():
            # Django refuses a blocking query from a thread running an event loop.
            self._stop_if(_heartbeat_reads.submit(self._probe.refresh).result())
        else:
            self._stop_if(self._probe.refresh())

    async def aheartbeat(self) -> None:
        """:meth:`heartbeat` for an ``async def`` activity: the read runs on a thread of
        its own (one per process, shared by every async activity's heartbeats) while the
        activity's event loop goes on."""
        why = await asyncio.get_running_loop().run_in_executor(_heartbeat_reads, self._probe.refresh)
        self._stop_if(why)

    def _stop_if(self, why: str | None) -> None:
        if why is not None:
            raise CancellationRequested(
                f"activity {self.activity_name} (run {self.run_id}, position {self.seq}) should stop: {why}",
                reason=why,
                requested_at=None,
            )


_heartbeat_reads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weft-heartbeat")
"""Where the heartbeats of async activities read: one thread, so one database connection
per process, whatever the number of async activities running."""


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def run_to_completion(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run an ``async def`` activity's coroutine to its end on an event loop of its own,
    and return its value (or raise its exception).

    In this thread (no loop runs here): the installed coroutine runner
    (:func:`~.ports.set_coroutine_runner`). The app's runs the loop in a thread of its
    own while this thread serves Django's async ORM calls (``acreate``, ``sync_to_async``),
    so they run here, on this thread's database connection, as a sync activity's queries
    do; without the app, ``asyncio.run`` here. Either way the loop is new and closed with
    the attempt, so a task the activity left running is cancelled when it ends instead of
    outliving it. When this thread already runs a loop (sync code called from async
    code: an async test, a runtime call made in an event loop), neither can start one
    here, so the coroutine runs on a new loop in a thread of its own, in a copy of this
    context (``activity_info()`` included), while this thread waits for it."""
    if not _loop_running():
        return get_coroutine_runner()(coroutine)
    context = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="weft-async-activity") as own_loop:
        return own_loop.submit(context.run, asyncio.run, coroutine).result()


_current_activity: contextvars.ContextVar[ActivityInfo | None] = contextvars.ContextVar(
    "weft_current_activity", default=None
)


def activity_info() -> ActivityInfo:
    """Inside an activity: the :class:`ActivityInfo` of the running attempt."""
    info = _current_activity.get()
    if info is None:
        raise RuntimeError("activity_info() is only available while an activity runs")
    return info


def describe_exception(exc: BaseException) -> dict[str, Any]:
    cls = type(exc)
    module = cls.__module__
    return {
        "type": cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}",
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }


def is_retryable(policy: RetryPolicy, exc: BaseException) -> bool:
    """Whether another attempt may follow a failed one (attempts left permitting): not for
    the policy's ``non_retryable`` types, nor for a result that is not JSON (retrying
    would produce the same result), nor for an activity that stopped because its run
    asked for cancellation (``CancellationRequested`` from ``heartbeat()``)."""
    return policy.is_retryable(exc) and not isinstance(exc, PayloadError | CancellationRequested)


@dataclass(frozen=True)
class Attempt:
    """How one attempt ended: its value (as the history will return it) and its encoding,
    or its error (:func:`describe_exception`) and whether it may be retried."""

    value: Any = None
    result_json: str | None = None
    error: dict[str, Any] | None = None
    retryable: bool = False

    @classmethod
    def failed(cls, exc: BaseException, policy: RetryPolicy) -> Attempt:
        return cls(error=describe_exception(exc), retryable=is_retryable(policy, exc))


@dataclass(frozen=True)
class AttemptFlow:
    """What flow control needs to let an attempt of an activity go: its keys and rate, or
    ``refusal``, the failed attempt of an activity whose keys could not be computed from
    its arguments (the same every time: it is not retried)."""

    rate_key: str = ""
    slot_key: str = ""
    rate: Rate | None = None
    refusal: Attempt | None = None

    @classmethod
    def of(
        cls, act: Activity[..., Any], args: Any, kwargs: dict[str, Any], overrides: Any
    ) -> AttemptFlow | None:
        """``None`` for an activity without flow control. ``overrides``: ``WEFT_RATE_LIMITS``."""
        if not act.flow_controlled:
            return None
        try:
            rate_key, slot_key = activity_flow_keys(act.name, act.rate_limit, act.concurrency, args, kwargs)
        except Exception as exc:
            return cls(refusal=Attempt(error=describe_exception(exc), retryable=False))
        rate = act.rate_limit.rate(overrides) if act.rate_limit is not None else None
        return cls(rate_key=rate_key, slot_key=slot_key, rate=rate)


def new_slot_holder() -> str:
    """A token naming one execution of an attempt that may hold a concurrency slot: only
    that execution renews and gives back the slot it takes
    (docs/explanation/flow-control.md, "Activity slots")."""
    return uuid.uuid4().hex


def admit_attempt(
    store: TurnStore,
    act: Activity[..., Any],
    flow: AttemptFlow,
    run_id: str,
    seq: int,
    *,
    ttl: float,
    reserved: datetime | None,
    now: Callable[[], datetime],
    holder: str,
) -> tuple[Hold | None, bool]:
    """Flow control's decision on an attempt about to start, inline or queued: ``(hold,
    holds_slot)``. ``hold`` is ``None`` when the attempt may start now; ``holds_slot``
    says it took a concurrency slot, for the execution ``holder`` (a token of the
    caller's, :func:`new_slot_holder`), which its caller gives back when it ends, or at
    once when it is held.

    A slot is taken first: none free, the attempt is queued for one (a freed slot is
    handed on to it and wakes it; ``until`` is when it looks again regardless). Then its
    rate limit moment: the one it was given (``reserved``) if it is not too late for it
    (:func:`~.flow.reservation_stands`), else a new one, which may be still to come."""
    limit = act.concurrency
    slot = False
    if limit is not None:
        taken = store.take_activity_slot(act.name, flow.slot_key, limit.limit, run_id, seq, ttl, holder)
        if not taken.held:
            until = now() + timedelta(seconds=ttl)
            return Hold(HoldKind.CONCURRENCY, act.name, until, key=flow.slot_key, limit=limit.limit,
                        in_use=taken.in_use, reserved=reserved), False  # fmt: skip
        slot = True
    try:
        return _admit_rate(store, act, flow, run_id, seq, reserved=reserved, now=now), slot
    except BaseException:
        if slot:  # a slot held by nobody would keep its next execution waiting for its lease
            assert limit is not None
            store.release_activity_slot(act.name, flow.slot_key, limit.limit, run_id, seq, ttl, holder)
        raise


def _admit_rate(
    store: TurnStore,
    act: Activity[..., Any],
    flow: AttemptFlow,
    run_id: str,
    seq: int,
    *,
    reserved: datetime | None,
    now: Callable[[], datetime],
) -> Hold | None:
    """The rate limit's part of :func:`admit_attempt`."""
    if act.rate_limit is None or flow.rate is None:
        return None
    if reserved is not None:
        if reservation_stands(reserved, now(), flow.rate):
            return None
        logger.info("run %s: activity %s (position %s) came too late for its rate limit moment %s; it takes "
                    "a new one", run_id, act.name, seq, reserved.isoformat())  # fmt: skip
    moment = store.take_rate_limit(act.rate_limit.name, flow.rate_key, flow.rate)
    if moment is None:
        return None
    return Hold(HoldKind.RATE_LIMIT, act.name, moment, key=flow.rate_key, name=act.rate_limit.name,
                reserved=moment)  # fmt: skip


def call_activity(
    act: Activity[..., Any],
    info: ActivityInfo,
    args: Any,
    kwargs: dict[str, Any],
    *,
    policy: RetryPolicy,
    within: Callable[[], AbstractContextManager[Any]] | None = None,
) -> Attempt:
    """Run one attempt of ``act`` with :func:`activity_info` returning ``info``.

    An exception of the activity (or a result that is not JSON) does not propagate: it is
    the returned attempt's error. ``within`` wraps the call and the encoding of its result
    (a savepoint for an atomic activity's writes): a failure leaves it by the exception,
    so what it wrote rolls back while the failure is still reported. An ``async def``
    activity (or override) is run to its end here (:func:`run_to_completion`)."""
    token = _current_activity.set(info)
    try:
        with within() if within is not None else nullcontext():
            body = activity_overrides.body_of(act)
            value = body(*args, **kwargs)
            if inspect.iscoroutine(value):
                value = run_to_completion(value)
            value, result_json = codec.roundtrip(value, what=f"the result of activity {act.name}")
        return Attempt(value=value, result_json=result_json)
    except Exception as exc:
        failed = Attempt.failed(exc, policy)
        if act.marks_attempts and info.worker and failed.error is not None:
            failed.error["worker"] = info.worker
        return failed
    finally:
        _current_activity.reset(token)


MAX_LOST_ATTEMPTS = 3
"""An activity that marks its attempts (:attr:`~django_weft.engine.registry.Activity.marks_attempts`)
fails once this many of its attempts were lost with their worker: an attempt that takes
its worker down each time (out of memory, a segfault) must not do so for ever."""


def lost_attempt(recorded: StepRecord) -> dict[str, Any]:
    """The entry of :attr:`StepRecord.failed_attempts` for the attempt ``recorded`` marked
    as started, whose worker stopped before it ended (``"lost": true``)."""
    worker = str((recorded.result or {}).get("worker", ""))
    error = {
        "type": ErrorType.WORKER_LOST,
        "message": f"attempt {recorded.attempt} did not end: its worker {worker or '(unknown)'} stopped "
        "or lost the run while it ran",
        "traceback": "",
        "worker": worker,
    }
    return {**failed_attempt(recorded.attempt, error, recorded.started_at, None), "lost": True}


def lost_attempts(failed: Sequence[dict[str, Any]]) -> int:
    """How many of the attempts in ``failed`` were lost with their worker (not failed)."""
    return sum(1 for entry in failed if entry.get("lost"))


def activity_failed(name: str, seq: int, error: dict[str, Any], attempt: int) -> ActivityFailed:
    return ActivityFailed(
        f"activity {name} failed after {attempt} attempt(s): "
        f"{error.get('type', 'Exception')}: {error.get('message', '')}",
        activity=name,
        seq=seq,
        attempt=attempt,
        cause_type=error.get("type"),
        cause_message=error.get("message"),
        cause_traceback=error.get("traceback"),
    )
