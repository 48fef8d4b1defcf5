"""Lifecycle operations on a run, from any process: cancel, suspend, resume, retry, reset."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.db import transaction

from ..conf import weft_settings
from ..engine import codec, run_logging
from ..engine.errors import (
    InvalidInput,
    InvalidTransition,
    WorkflowTerminalError,
)
from ..engine.records import (
    ClaimedRun,
    RunStatus,
)
from ..engine.registry import registry
from ..engine.reset import ResetOutcome, check_cut, replay_kept
from ..engine.run_logging import get_logger
from ..models import WorkflowRun
from .dispatch import delivers, get_dispatcher, ring_turn
from .operations import OPERATIONS, RESET_REASON
from .process import dispatch_on_commit, get_engine, get_store
from .reading import get_run
from .worker import dispatch_finalizer

logger = get_logger("django_weft.runtime")


def _on_live_run(ref: str | uuid.UUID, transition: Callable[[WorkflowRun], Any]) -> WorkflowRun:
    """Apply ``transition`` to the run in a transaction; if the run turns out to have
    continued as new (between looking it up and locking it, or by its run id), apply it
    to the run it continued as."""
    run = get_run(ref)
    alias = weft_settings.DATABASE_ALIAS
    for _ in range(100):
        try:
            with transaction.atomic(using=alias):
                transition(run)
            return run
        except WorkflowTerminalError as exc:
            if getattr(exc, "status", None) != RunStatus.CONTINUED:
                raise
            result = (
                WorkflowRun.objects.using(alias).filter(pk=run.pk).values_list("result", flat=True).first()
            )
            run = get_run((result or {})["continued_as"])
    raise InvalidTransition(
        f"run {ref} continued as new more than 100 times while being changed; try again",
        run_id=str(run.pk),
        status=RunStatus.CONTINUED,
    )


CANCEL_MODES = OPERATIONS["cancel"].values("mode")
"""``cancel(mode=...)``: close the run now, or send the workflow a cancellation request."""


def cancel(ref: str | uuid.UUID, reason: str | None = None, *, mode: str = "terminate") -> str:
    """Cancel a run; returns its status afterwards.

    ``mode="terminate"`` (the default): the run is ``cancelled`` durably on return,
    whichever process drives it (that worker is deposed at its next write and stops), its
    pending timers are removed and its pending updates failed; ``result()`` raises
    ``WorkflowCancelled``. Works on suspended runs.

    ``mode="request"``: a cancellation request is stored (durable on return) and a parked
    run woken; the workflow receives ``CancellationRequested`` at its current or next
    blocking point, at a position recorded in its history, and may clean up with durable
    steps before it finishes ``cancelled``, or catch it and carry on. A request pending
    already stores nothing new. Returns the run's status (``running`` for a run it woke).

    Both raise ``WorkflowTerminalError`` for a finished run, and ``InvalidInput`` for a
    reason that is not text the database can store or is longer than
    :data:`~.operations.REASON_MAX_LENGTH`, or an unknown mode."""
    described = OPERATIONS["cancel"]
    if reason is not None:
        assert described.reason is not None
        reason = described.reason.check(reason)
    described.check_choice("mode", mode)
    if mode == "request":
        return _request_cancel(ref, reason)
    store = get_store()

    def transition(run: WorkflowRun) -> None:
        closed = store.transitions.cancel(run.pk, reason)
        if closed.woken_parent:
            dispatch_on_commit(closed.woken_parent)
        if closed.finalizer:
            transaction.on_commit(lambda: dispatch_finalizer(str(run.pk), 1), using=store.alias)

    run = _on_live_run(ref, transition)
    logger.info("run %s (%s %s): cancelled%s", run.pk, run.workflow_name, run.workflow_id,
                f" ({reason})" if reason else "", extra=_fields(run))  # fmt: skip
    _close_children(str(run.pk), f"its parent run {run.pk} was cancelled")
    return RunStatus.CANCELLED


def _request_cancel(ref: str | uuid.UUID, reason: str | None) -> str:
    store = get_store()
    outcome: list[Any] = []

    def transition(run: WorkflowRun) -> None:
        requested = store.transitions.request_cancel(run.pk, reason, dispatched=delivers(get_dispatcher()))
        if requested.woken:
            dispatch_on_commit(str(run.pk))
        outcome[:] = [requested]

    run = _on_live_run(ref, transition)
    requested = outcome[0]
    if requested.duplicate:
        logger.info("run %s (%s %s): a cancellation request is pending already", run.pk, run.workflow_name,
                    run.workflow_id, extra=_fields(run))  # fmt: skip
    else:
        logger.info("run %s (%s %s): cancellation requested%s", run.pk, run.workflow_name, run.workflow_id,
                    f" ({reason})" if reason else "", extra=_fields(run))  # fmt: skip
    return str(requested.status)


def _fields(run: WorkflowRun) -> dict[str, Any]:
    return run_logging.fields_of(run.pk, run.workflow_id, run.workflow_name)


def _close_children(run_id: str, reason: str) -> None:
    for child in get_store().turns.close_children(run_id, reason):
        logger.info("run %s: parent-close policy applied, its parent run %s was cancelled", child, run_id,
                    extra=run_logging.fields_of(child))  # fmt: skip
        dispatch_on_commit(child)


def suspend(ref: str | uuid.UUID) -> str:
    """Suspend a running or waiting run: no worker drives it (one driving it now is
    deposed at its next write) until :func:`resume`. Signals and updates sent meanwhile
    are kept; timers that come due meanwhile are collected and re-armed by the resume.
    Raises ``InvalidTransition`` for other states (``WorkflowTerminalError`` if finished)."""
    store = get_store()
    run = _on_live_run(ref, lambda run: store.transitions.suspend(run.pk))
    logger.info("run %s (%s %s): suspended", run.pk, run.workflow_name, run.workflow_id, extra=_fields(run))
    return RunStatus.SUSPENDED


def resume(ref: str | uuid.UUID) -> str:
    """Resume a suspended run: it becomes runnable and a worker continues it where it
    waits (a sleep whose time passed meanwhile ends at once). Raises
    ``InvalidTransition`` if the run is not suspended."""
    store = get_store()

    def transition(run: WorkflowRun) -> None:
        store.transitions.resume(run.pk, dispatched=delivers(get_dispatcher()))
        dispatch_on_commit(str(run.pk))

    run = _on_live_run(ref, transition)
    logger.info("run %s (%s %s): resumed", run.pk, run.workflow_name, run.workflow_id, extra=_fields(run))
    return RunStatus.RUNNING


def retry(ref: str | uuid.UUID) -> str:
    """Reactivate a failed run: the failed step (if a step failed it) is attempted afresh
    and every step before it replays, so nothing that completed runs again. After a
    ``NonDeterminismError``, retry once the code matches the history again. Raises
    ``InvalidTransition`` if the run has not failed, or if another run with its workflow
    id is active."""
    run = get_run(ref)
    store = get_store()
    with transaction.atomic(using=store.alias):
        outcome = store.transitions.reactivate(run.pk, dispatched=delivers(get_dispatcher()))
        dispatch_on_commit(str(run.pk))
    removed = outcome.removed_from
    logger.info("run %s (%s %s): retried%s", run.pk, run.workflow_name, run.workflow_id,
                f" from position {removed}" if removed is not None else "", extra=_fields(run))  # fmt: skip
    return RunStatus.RUNNING


def reset(
    ref: str | uuid.UUID,
    to_seq: int,
    *,
    args: list[Any] | tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    reason: str,
) -> ResetOutcome:
    """Start a new run of the run's workflow id from position ``to_seq`` of its history.

    The new run keeps the entries before ``to_seq`` (copied: they replay, nothing in them
    runs again) and continues live from there; ``args``/``kwargs`` replace the input (the
    kept entries must still replay with it). The old run, if active, is closed
    (``cancelled``, its worker deposed at its next write, its timers removed, its children
    handled by their parent-close policy, no finalizer); finished or not, it links to the
    new run (``reset_to``) and the new run to it (``reset_from``). Both happen in one
    transaction, or neither. Signals and updates the workflow received at or after
    ``to_seq``, and those still pending, are delivered to the new run again.

    Returns a :class:`ResetOutcome`. Nothing is written when it raises: ``InvalidInput``
    (``field`` ``"to_seq"``) for a position the history cannot be cut at or the new run
    could not replay to, a missing reason or bad input; ``InvalidTransition`` if the run is
    not the latest of its workflow id, another run of the id is active, or the deadline
    has passed; ``WorkflowNotRegistered`` if this process does not have the workflow's code
    (the kept entries are replayed here first)."""
    reason = RESET_REASON.check(reason)
    run = get_run(ref)
    definition = registry.get_workflow(run.workflow_name)
    new_args, new_kwargs = _reset_input(run, args, kwargs)
    definition.check_arguments(new_args, new_kwargs)
    store = get_store()
    label = f"run {run.pk} ({run.workflow_name} {run.workflow_id})"
    history = store.sql.load_steps(str(run.pk))
    check_cut(history, to_seq, label=label, now=store.db_now())
    kept = {seq: history[seq] for seq in range(to_seq)}
    replay_kept(
        get_engine(),
        ClaimedRun(
            run_id=str(run.pk),
            workflow_id=run.workflow_id,
            workflow_name=run.workflow_name,
            args=new_args,
            kwargs=new_kwargs,
            epoch=0,
            attempt=1,
            created_at=run.created_at,
            db_now=store.db_now(),
            steps=kept,
            parent_run_id=str(run.parent_id) if run.parent_id else None,
            search_attributes=run.search_attributes or {},
        ),
        to_seq,
        label=label,
    )
    dispatcher = get_dispatcher()
    with transaction.atomic(using=store.alias):
        outcome = store.resets.reset(
            run.pk,
            to_seq,
            kept=kept,
            args=new_args,
            kwargs=new_kwargs,
            version=definition.version,
            reason=reason,
            dispatched=delivers(dispatcher),
        )
    logger.info("run %s (%s %s): reset to position %s as run %s (%s)", run.pk, run.workflow_name,
                run.workflow_id, to_seq, outcome.run_id, reason, extra=_fields(run))  # fmt: skip
    if outcome.closed:
        _close_children(str(run.pk), f"its parent run {run.pk} was reset")
    # Rung after the old run's children are closed: a child the new run starts again at
    # the same position takes the same workflow id, which a live child would still hold.
    if delivers(dispatcher):
        ring_turn(dispatcher, outcome.run_id, priority=run.priority)  # the new run keeps the priority
    return outcome


def _reset_input(
    run: WorkflowRun, args: list[Any] | tuple[Any, ...] | None, kwargs: dict[str, Any] | None
) -> tuple[list[Any], dict[str, Any]]:
    """The new run's input: the old run's, with ``args`` and ``kwargs`` replaced if given."""
    limit = weft_settings.MAX_PAYLOAD_BYTES
    if args is None:
        new_args = list(run.args or [])
    elif isinstance(args, list | tuple):
        new_args = codec.loads(codec.dumps(list(args), what="args", limit=limit))
    else:
        raise InvalidInput(f"args must be a list; got {type(args).__name__}", field="args")
    if kwargs is None:
        new_kwargs = dict(run.kwargs or {})
    elif isinstance(kwargs, dict) and all(isinstance(key, str) for key in kwargs):
        new_kwargs = codec.loads(codec.dumps(kwargs, what="kwargs", limit=limit))
    else:
        raise InvalidInput("kwargs must be a dict with string keys", field="kwargs")
    return new_args, new_kwargs
