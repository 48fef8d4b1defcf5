"""Work on workers: a turn of a run, an attempt of a queued activity, an attempt of a
finalizer (and sending a finalizer attempt to a worker)."""

from __future__ import annotations

import enum
import logging
from typing import Any

from django.db import transaction

from ..conf import weft_settings
from ..engine import codec, faults
from ..engine.activities import ActivityInfo, CancelProbe, call_activity
from ..engine.error_types import ErrorType
from ..engine.executor import TurnOutcome
from ..engine.finalizers import retry_in as finalizer_retry_in
from ..engine.ports import Dispatcher
from ..engine.records import (
    FINALIZER_SEQ,
    StepStatus,
)
from ..engine.registry import Activity, registry
from ..models import WorkflowRun
from .dispatch import delivers, get_dispatcher
from .heartbeat import ensure_heartbeat, running_attempt
from .process import get_engine, get_store
from .workers import is_advertising, live_window

logger = logging.getLogger("django_weft.runtime")


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


def run_activity(run_id: str, seq: int, attempt: int) -> ActivityOutcome:
    """Run attempt ``attempt`` of the queued activity at position ``seq`` of a run.

    Safe to call for any delivery: exactly one caller takes a given attempt (a duplicate
    gets ``SKIPPED``), and its outcome is recorded only if the attempt is still current
    (fenced by run, seq and attempt). A recorded outcome wakes the run when it waits for
    it. ``atomic=True`` activities run inside the transaction that records them.
    """
    if seq == FINALIZER_SEQ:
        return run_finalizer(run_id, attempt)
    store = get_store()
    run_id = str(run_id)
    started = store.attempts.start_activity(run_id, seq, attempt, weft_settings.LEASE_TTL)
    if started is None:
        logger.info("run %s: activity %s attempt %s is not startable (duplicate or stale); skipped",
                    run_id, seq, attempt)  # fmt: skip
        return ActivityOutcome.SKIPPED
    ensure_heartbeat()
    name = started.name
    act = registry.activities.get(name)
    # heartbeat() reads whether the run asked for cancellation; the process's lease
    # heartbeat checks too, for cancel_requested.
    probe = CancelProbe(lambda: store.turns.cancellation_requested(run_id, seq))
    info = ActivityInfo(run_id, started.workflow_id, started.workflow_name, name, seq, attempt, probe)
    label = f"run {run_id}: activity {name} (position {seq}, attempt {attempt})"
    outcome: list[str] = []

    def call() -> tuple[str, str | None, str | None]:
        written = _call_activity(act, info, started.args, store.alias) if act is not None else (
            StepStatus.ATTEMPT_FAILED,
            None,
            codec.dumps({
                "type": ErrorType.ACTIVITY_NOT_REGISTERED,
                "message": f"activity {name!r} is not registered in worker {get_engine().engine_id}",
                "retryable": True,
            }),
        )  # fmt: skip
        outcome.append(written[0])
        return written

    with running_attempt(run_id, seq, attempt, probe):
        if act is not None and act.atomic:
            recorded, woken = store.attempts.finish_activity(run_id, seq, attempt, status="", body=call)
        else:
            status, result_json, error_json = call()
            recorded, woken = store.attempts.finish_activity(
                run_id, seq, attempt, status=status, result_json=result_json, error_json=error_json
            )
    if woken:
        try:
            get_dispatcher().dispatch_turn(run_id)
        except Exception:
            logger.warning("run %s: could not dispatch a turn; the sweep will", run_id, exc_info=True)
    if not recorded:
        logger.warning("%s: ran, but the attempt is no longer current; outcome discarded", label)
        return ActivityOutcome.DISCARDED
    failed = outcome[0] == StepStatus.ATTEMPT_FAILED
    logger.info("%s: %s", label, "attempt failed" if failed else "completed")
    return ActivityOutcome.FAILED if failed else ActivityOutcome.COMPLETED


def run_finalizer(run_id: str, attempt: int) -> ActivityOutcome:
    """Run attempt ``attempt`` of a cancelled or timed-out run's finalizer with the state
    the workflow recorded (``ctx.set_finalizer_state``), and record its outcome on the
    run. At least once: a duplicate delivery of an attempt is skipped, and a worker that
    dies mid-attempt leaves its lease to run out, after which the sweep sends the next
    attempt. Failures are retried by the finalizer activity's retry policy."""
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
        return ActivityOutcome.DISCARDED
    if error is None:
        logger.info("%s: completed", label)
        return ActivityOutcome.COMPLETED
    logger.warning("%s: failed (%s: %s)%s", label, error.get("type"), error.get("message"),
                   f"; retried in {retry_in:.1f} s" if retry_in is not None else "")  # fmt: skip
    return ActivityOutcome.FAILED


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
    return StepStatus.ATTEMPT_FAILED, None, codec.dumps({**attempt.error, "retryable": attempt.retryable})
