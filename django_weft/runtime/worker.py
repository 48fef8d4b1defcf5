"""Work on workers: a turn of a run, an attempt of a queued activity, an attempt of a
finalizer (and sending a finalizer attempt to a worker)."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db import transaction

from ..conf import weft_settings
from ..engine import codec, faults, observe, run_logging
from ..engine.attempt import (
    ActivityInfo,
    Attempt,
    AttemptFlow,
    CancelProbe,
    admit_attempt,
    call_activity,
    new_slot_holder,
)
from ..engine.error_types import ErrorType
from ..engine.executor import TurnOutcome
from ..engine.finalizers import retry_in as finalizer_retry_in
from ..engine.flow import HoldKind
from ..engine.ports import Dispatcher
from ..engine.records import (
    FINALIZER_SEQ,
    StepStatus,
)
from ..engine.registry import Activity, registry
from ..engine.run_logging import get_logger
from ..models import WorkflowRun
from ..store import DjangoStore
from ..store.attempts import Held, StartedAttempt
from .dispatch import delivers, get_dispatcher, ring_turn
from .heartbeat import ensure_heartbeat, running_attempt
from .process import get_engine, get_store
from .workers import is_advertising, live_window

logger = get_logger("django_weft.runtime")


def run_turn(run_id: str) -> TurnOutcome:
    """Claim ``run_id`` and drive it until it parks or finishes (safe to call for any id).

    In an advertising worker (a Celery worker), a turn not claimed because this worker
    lacks the run's workflow is handed on: when a live worker has that workflow, the run's
    dispatch mark is cleared, so the next sweep sends it again at once, at most once a
    tick (docs/explanation/decisions.md)."""
    engine = get_engine()
    outcome = engine.run_turn(str(run_id))
    if outcome == TurnOutcome.NOT_CLAIMED and is_advertising():
        known = engine.workflows.workflow_names()
        name = get_store().workers.send_again_if_elsewhere(str(run_id), known, live_window())
        if name is not None:
            logger.info("run %s: workflow %s is not registered in this worker; left for one that has it",
                        run_id, name)  # fmt: skip
    return outcome


class ActivityOutcome(enum.StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"  # this attempt failed; the workflow decides on a retry
    SKIPPED = "skipped"  # a duplicate delivery, a stale attempt or a finished run
    DISCARDED = "discarded"  # ran, but the attempt was lost meanwhile: not recorded
    DELAYED = "delayed"  # flow control held it (a rate limit, a concurrency slot): sent again later


def run_activity(run_id: str, seq: int, attempt: int) -> ActivityOutcome:
    """Run attempt ``attempt`` of the queued activity at position ``seq`` of a run.

    Safe to call for any delivery: exactly one caller takes a given attempt (a duplicate
    gets ``SKIPPED``), and its outcome is recorded only if the attempt is still current
    (fenced by run, seq and attempt). A recorded outcome wakes the run when it waits for
    it. ``atomic=True`` activities run inside the transaction that records them.
    """
    if seq == FINALIZER_SEQ:
        return run_finalizer(run_id, attempt)
    with run_logging.bound(run_id=str(run_id), seq=seq, attempt=attempt):
        return _run_activity(str(run_id), seq, attempt)


def _run_activity(run_id: str, seq: int, attempt: int) -> ActivityOutcome:
    store = get_store()
    worker = get_engine().engine_id
    started = store.attempts.start_activity(run_id, seq, attempt, weft_settings.LEASE_TTL, worker=worker)
    if started is None:
        logger.info("run %s: activity %s attempt %s is not startable (duplicate or stale); skipped",
                    run_id, seq, attempt)  # fmt: skip
        return ActivityOutcome.SKIPPED
    ensure_heartbeat()
    with run_logging.bound(workflow_id=started.workflow_id, workflow=started.workflow_name):
        return _run_taken_attempt(store, started, run_id, seq, attempt, worker)


def _run_taken_attempt(
    store: DjangoStore, started: StartedAttempt, run_id: str, seq: int, attempt: int, worker: str
) -> ActivityOutcome:
    name = started.name
    act = registry.activities.get(name)
    label = f"run {run_id}: activity {name} (position {seq}, attempt {attempt})"
    observe.schedule_to_start(
        observe.StartKind.ACTIVITY, started.scheduled_at, started.taken_at, workflow=started.workflow_name,
        activity=name,
    )  # fmt: skip
    # heartbeat() reads whether the run asked for cancellation; the process's lease
    # heartbeat checks too, for cancel_requested.
    probe = CancelProbe(lambda: store.turns.cancellation_requested(run_id, seq))
    info = ActivityInfo(
        run_id, started.workflow_id, started.workflow_name, name, seq, attempt, probe, worker=worker
    )
    queue = act.queue if act is not None else None
    attempt_scope = observe.activity_attempt(
        info, queue=queue or "", inline=False, carrier=started.trace_context
    )
    with attempt_scope as seen:
        outcome = _run_started_attempt(store, started, act, info, label)
        seen.outcome = _OBSERVED.get(outcome[0], outcome[0])
        seen.error = outcome[1]
    return outcome[0]


_OBSERVED = {
    # A failed queued attempt is retried or not by its workflow's next turn.
    ActivityOutcome.FAILED: observe.AttemptOutcome.ATTEMPT_FAILED,
    ActivityOutcome.DELAYED: observe.AttemptOutcome.HELD,
    ActivityOutcome.DISCARDED: observe.AttemptOutcome.DISCARDED,
    ActivityOutcome.COMPLETED: observe.AttemptOutcome.COMPLETED,
}


def _run_started_attempt(
    store: DjangoStore,
    started: StartedAttempt,
    act: Activity[..., Any] | None,
    info: ActivityInfo,
    label: str,
) -> tuple[ActivityOutcome, dict[str, Any] | None]:
    """Run a queued attempt this worker took: flow control, the call, its record; the
    outcome, and the attempt's error if it failed."""
    run_id, seq, attempt, name = info.run_id, info.seq, info.attempt, info.activity_name
    flow = (
        AttemptFlow.of(
            act, started.args.get("args", []), started.args.get("kwargs", {}), weft_settings.RATE_LIMITS
        )
        if act is not None
        else None
    )
    admission = (
        _admit(act, flow, run_id, seq, attempt, reserved=started.reserved) if act and flow else _Slot()
    )
    if admission is None:
        logger.info("%s: held by flow control, sent again later", label)
        return ActivityOutcome.DELAYED, None
    outcome: list[tuple[str, str | None, str | None]] = []

    def call() -> tuple[str, str | None, str | None]:
        if act is None:
            written: tuple[str, str | None, str | None] = (
                StepStatus.ATTEMPT_FAILED,
                None,
                codec.dumps({
                    "type": ErrorType.ACTIVITY_NOT_REGISTERED,
                    "message": f"activity {name!r} is not registered in worker {get_engine().engine_id}",
                    "retryable": True,
                }),
            )  # fmt: skip
        elif flow is not None and flow.refusal is not None:
            written = _failed_attempt(flow.refusal)
        else:
            written = _call_activity(act, info, started.args, store.alias)
        outcome.append(written)
        return written

    try:
        with running_attempt(run_id, seq, attempt, info._probe), admission.running():
            if act is not None and act.atomic:
                recorded, woken = store.attempts.finish_activity(run_id, seq, attempt, status="", body=call)
            else:
                status, result_json, error_json = call()
                recorded, woken = store.attempts.finish_activity(
                    run_id, seq, attempt, status=status, result_json=result_json, error_json=error_json
                )
    finally:
        admission.release()
    if woken:
        try:
            ring_turn(get_dispatcher(), run_id, priority=started.priority)
        except Exception:
            logger.warning("run %s: could not dispatch a turn; the sweep will", run_id, exc_info=True)
    status, _, error_json = outcome[0]
    error = codec.loads(error_json) if error_json is not None else None
    if not recorded:
        logger.warning("%s: ran, but the attempt is no longer current; outcome discarded", label)
        return ActivityOutcome.DISCARDED, error
    failed = status == StepStatus.ATTEMPT_FAILED
    logger.info("%s: %s", label, "attempt failed" if failed else "completed")
    return (ActivityOutcome.FAILED, error) if failed else (ActivityOutcome.COMPLETED, None)


def run_finalizer(run_id: str, attempt: int) -> ActivityOutcome:
    """Run attempt ``attempt`` of a cancelled or timed-out run's finalizer with the state
    the workflow recorded (``ctx.set_finalizer_state``), and record its outcome on the
    run. At least once: a duplicate delivery of an attempt is skipped, and a worker that
    dies mid-attempt leaves its lease to run out, after which the sweep sends the next
    attempt. Failures are retried by the finalizer activity's retry policy."""
    with run_logging.bound(run_id=str(run_id), seq=FINALIZER_SEQ, attempt=attempt):
        return _run_finalizer(str(run_id), attempt)


def _run_finalizer(run_id: str, attempt: int) -> ActivityOutcome:
    store = get_store()
    run_id = str(run_id)
    lease = weft_settings.LEASE_TTL
    runs = WorkflowRun.objects.using(store.alias)
    workflow_name = runs.filter(pk=run_id).values_list("workflow_name", flat=True).first()
    if workflow_name is not None and workflow_name not in registry.workflows:
        # Another worker has the code and the finalizer: the attempt is not started here,
        # and the sweep sends it again (docs/explanation/decisions.md, decision 9).
        logger.info("run %s: workflow %s is not registered here; finalizer left to another worker", run_id,
                    workflow_name)  # fmt: skip
        return ActivityOutcome.SKIPPED
    started = store.finalizers.start_finalizer(run_id, attempt, lease)
    if started is None:
        logger.info(
            "run %s: finalizer attempt %s is not startable (duplicate or stale); skipped", run_id, attempt
        )
        return ActivityOutcome.SKIPPED
    name, state = started
    if name is None:
        definition = registry.workflows.get(workflow_name or "")
        if definition is None or definition.finalizer is None:
            store.finalizers.finish_finalizer(run_id, attempt, drop=True)
            logger.info("run %s: its workflow has no finalizer here; none to run", run_id)
            return ActivityOutcome.SKIPPED
        name = definition.finalizer.name
    act = registry.activities.get(name)
    run = WorkflowRun.objects.using(store.alias).values("workflow_id", "workflow_name").get(pk=run_id)
    info = ActivityInfo(run_id, run["workflow_id"], run["workflow_name"], name, FINALIZER_SEQ, attempt)
    label = f"run {run_id}: finalizer {name} (attempt {attempt})"
    queue = (act.queue if act is not None else None) or ""
    with observe.activity_attempt(info, queue=queue, inline=False) as seen:
        outcome, error, retried = _finalizer_attempt(store, act, info, state, label)
        seen.error = error
        if outcome == ActivityOutcome.FAILED:
            seen.outcome = observe.AttemptOutcome.RETRIED if retried else observe.AttemptOutcome.FAILED
        else:
            seen.outcome = _OBSERVED.get(outcome, outcome)
    return outcome


def _finalizer_attempt(
    store: DjangoStore, act: Activity[..., Any] | None, info: ActivityInfo, state: Any, label: str
) -> tuple[ActivityOutcome, dict[str, Any] | None, bool]:
    """Run a finalizer attempt this worker took and record it: its outcome, its error and
    whether another attempt follows."""
    run_id, attempt, name = info.run_id, info.attempt, info.activity_name
    if act is None:
        error: dict[str, Any] | None = {
            "type": ErrorType.ACTIVITY_NOT_REGISTERED,
            "message": f"activity {name!r} is not registered in worker {get_engine().engine_id}",
        }
        retryable = True
        policy = weft_settings.DEFAULT_RETRY_POLICY
        result = None
    else:
        ensure_heartbeat()
        with running_attempt(run_id, FINALIZER_SEQ, attempt):  # the heartbeat renews its lease
            _, result_json, error_json = _call_activity(
                act, info, {"args": [state], "kwargs": {}}, store.alias
            )
        result = codec.loads(result_json) if result_json is not None else None
        error = codec.loads(error_json) if error_json is not None else None
        retryable = bool(error.pop("retryable", True)) if error else False
        policy = act.retry or weft_settings.DEFAULT_RETRY_POLICY
    faults.hit("before_finalizer_finish", run_id=run_id, engine=get_engine())
    retry_in = finalizer_retry_in(policy, attempt, error, retryable=retryable)
    if not store.finalizers.finish_finalizer(run_id, attempt, result=result, error=error, retry_in=retry_in):
        logger.warning("%s: ran, but the attempt is no longer current; outcome discarded", label)
        return ActivityOutcome.DISCARDED, error, False
    if error is None:
        logger.info("%s: completed", label)
        return ActivityOutcome.COMPLETED, None, False
    logger.warning("%s: failed (%s: %s)%s", label, error.get("type"), error.get("message"),
                   f"; retried in {retry_in:.1f} s" if retry_in is not None else "")  # fmt: skip
    return ActivityOutcome.FAILED, error, retry_in is not None


def dispatch_finalizer(run_id: str, attempt: int, dispatcher: Dispatcher | None = None) -> None:
    """Send attempt ``attempt`` of a run's finalizer to a worker (a doorbell: the
    finalizer's timer makes the sweep send it again if this is lost)."""
    dispatcher = dispatcher or get_dispatcher()
    if not delivers(dispatcher):
        return
    row = (
        WorkflowRun.objects.using(weft_settings.DATABASE_ALIAS)
        .filter(pk=run_id)
        .values("finalizer", "workflow_name")
        .first()
    )
    if row is None:
        return  # purged meanwhile
    definition = registry.workflows.get(row["workflow_name"])
    name = (row["finalizer"] or {}).get("activity") or (
        definition.finalizer.name if definition is not None and definition.finalizer else None
    )
    act = registry.activities.get(str(name))
    queue = (act.queue if act is not None else None) or ""
    try:
        dispatcher.dispatch_activity(
            str(run_id), FINALIZER_SEQ, attempt, queue=queue, timeout=act.timeout if act else None
        )
    except Exception:
        logger.warning("run %s: could not dispatch its finalizer; the sweep will", run_id, exc_info=True)


class _Slot:
    """The concurrency slot a queued attempt's execution (``holder``) holds, or its
    place in the queue (none without ``act``): the slot is renewed with the process's
    leases while it runs; :meth:`release` gives either back, and hands free slots on."""

    def __init__(
        self, act: Activity[..., Any] | None = None, key: str = "", run_id: str = "", seq: int = 0
    ) -> None:
        self.act = act
        self.key = key
        self.run_id = run_id
        self.seq = seq
        self.holder = new_slot_holder()
        self.holds = False

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        if self.act is None or not self.holds:
            yield
            return
        with get_engine().holding_slot(self.run_id, self.seq, self.holder):
            yield

    def release(self) -> None:
        act, self.act = self.act, None
        if act is None or act.concurrency is None:
            return
        try:
            woken = get_store().activity_flow.release_slot(
                act.name, self.key, act.concurrency.limit, self.run_id, self.seq, weft_settings.LEASE_TTL,
                self.holder if self.holds else None,
            )  # fmt: skip
        except Exception:
            logger.warning(
                "run %s: could not give back the concurrency slot of activity %s; its lease frees it",
                self.run_id,
                act.name,
                exc_info=True,
            )
            return
        ring_turns(woken)


def _admit(
    act: Activity[..., Any],
    flow: AttemptFlow,
    run_id: str,
    seq: int,
    attempt: int,
    *,
    reserved: datetime | None,
) -> _Slot | None:
    """Let a started queued attempt go through flow control, as an inline one does
    (:func:`~django_weft.engine.attempt.admit_attempt`). Returns the slot it holds (or
    none), or ``None`` when it is held (its step ``delayed``: its run sends it again
    when the hold is over) or no longer current."""
    if flow.refusal is not None:
        return _Slot()  # recorded as a failed attempt, not retried
    store = get_store()
    slot = _Slot(act, flow.slot_key, run_id, seq) if act.concurrency is not None else _Slot()
    hold, slot.holds = admit_attempt(
        store.turns, act, flow, run_id, seq, ttl=weft_settings.LEASE_TTL, reserved=reserved, now=store.db_now,
        holder=slot.holder,
    )  # fmt: skip
    if hold is None:
        return slot
    if slot.holds:
        slot.release()  # an attempt waiting for its rate limit moment holds no slot
    held = store.attempts.hold_activity(run_id, seq, attempt, hold, holder=slot.holder)
    if held is Held.RUN:
        slot.holds = True  # a slot was handed on to it meanwhile, now its own: it runs
        return slot
    if held is Held.GONE and hold.kind == HoldKind.CONCURRENCY:
        slot.release()  # its run or position is done with: it gives its place in the queue back
    elif held is Held.HELD and hold.kind == HoldKind.RATE_LIMIT:
        # Its run sends it again at that moment; the sweep rings too if this is lost.
        ring_turns([run_id], eta=hold.until)
    return None


def ring_turns(run_ids: list[str], *, eta: datetime | None = None) -> None:
    """Ring the doorbells of ``run_ids`` (a failure is logged: the sweep finds them)."""
    for woken in run_ids:
        try:
            get_dispatcher().dispatch_turn(woken, eta=eta)
        except Exception:
            logger.warning("run %s: could not dispatch a turn; the sweep will", woken, exc_info=True)


def _failed_attempt(attempt: Attempt) -> tuple[str, str | None, str | None]:
    assert attempt.error is not None
    return StepStatus.ATTEMPT_FAILED, None, codec.dumps({**attempt.error, "retryable": attempt.retryable})


def _call_activity(
    act: Activity[..., Any], info: ActivityInfo, payload: dict[str, Any], alias: str
) -> tuple[str, str | None, str | None]:
    """Run one attempt through the engine's one activity path; return the step's
    (status, result_json, error_json).

    An atomic activity runs in a savepoint of the recording transaction, so a failed
    attempt's writes roll back while its failure is still recorded."""
    attempt = call_activity(
        act,
        info,
        payload.get("args", []),
        payload.get("kwargs", {}),
        policy=act.retry or weft_settings.DEFAULT_RETRY_POLICY,
        within=(lambda: transaction.atomic(using=alias)) if act.atomic else None,
    )
    if attempt.error is None:
        return StepStatus.COMPLETED, attempt.result_json, None
    return _failed_attempt(attempt)
