"""Lifecycle operations on a run, from any process: cancel, suspend, resume, retry."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from django.db import transaction

from ..conf import weft_settings
from ..engine import codec
from ..engine.errors import (
    InvalidInput,
    InvalidTransition,
    WorkflowTerminalError,
)
from ..engine.records import (
    RunStatus,
)
from ..models import WorkflowRun
from .dispatch import delivers, get_dispatcher
from .process import _dispatch_on_commit, get_store
from .reading import get_run
from .worker import dispatch_finalizer

logger = logging.getLogger("django_weft.runtime")


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


CANCEL_MODES = ("terminate", "request")
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
    reason that is not text the database can store or an unknown mode."""
    if reason is not None and not isinstance(reason, str):
        raise InvalidInput(f"reason must be a string; got {type(reason).__name__}")
    if reason is not None:
        codec.dumps(reason, what="the cancellation reason")  # no NUL, no lone surrogate
    if mode not in CANCEL_MODES:
        raise InvalidInput(f"mode must be one of {', '.join(CANCEL_MODES)}; got {mode!r}")
    if mode == "request":
        return _request_cancel(ref, reason)
    store = get_store()

    def transition(run: WorkflowRun) -> None:
        closed = store.cancel(run.pk, reason)
        if closed.woken_parent:
            _dispatch_on_commit(closed.woken_parent)
        if closed.finalizer:
            transaction.on_commit(lambda: dispatch_finalizer(str(run.pk), 1), using=store.alias)

    run = _on_live_run(ref, transition)
    logger.info("run %s (%s %s): cancelled%s", run.pk, run.workflow_name, run.workflow_id,
                f" ({reason})" if reason else "")  # fmt: skip
    _close_children(str(run.pk), f"its parent run {run.pk} was cancelled")
    return RunStatus.CANCELLED


def _request_cancel(ref: str | uuid.UUID, reason: str | None) -> str:
    store = get_store()
    outcome: list[Any] = []

    def transition(run: WorkflowRun) -> None:
        requested = store.request_cancel(run.pk, reason, dispatched=delivers(get_dispatcher()))
        if requested.woken:
            _dispatch_on_commit(str(run.pk))
        outcome[:] = [requested]

    run = _on_live_run(ref, transition)
    requested = outcome[0]
    if requested.duplicate:
        logger.info("run %s (%s %s): a cancellation request is pending already", run.pk, run.workflow_name,
                    run.workflow_id)  # fmt: skip
    else:
        logger.info("run %s (%s %s): cancellation requested%s", run.pk, run.workflow_name, run.workflow_id,
                    f" ({reason})" if reason else "")  # fmt: skip
    return str(requested.status)


def _close_children(run_id: str, reason: str) -> None:
    for child in get_store().close_children(run_id, reason):
        logger.info("run %s: parent-close policy applied, its parent run %s was cancelled", child, run_id)
        _dispatch_on_commit(child)


def suspend(ref: str | uuid.UUID) -> str:
    """Suspend a running or waiting run: no worker drives it (one driving it now is
    deposed at its next write) until :func:`resume`. Signals and updates sent meanwhile
    are kept; timers that come due meanwhile are collected and re-armed by the resume.
    Raises ``InvalidTransition`` for other states (``WorkflowTerminalError`` if finished)."""
    store = get_store()
    run = _on_live_run(ref, lambda run: store.suspend(run.pk))
    logger.info("run %s (%s %s): suspended", run.pk, run.workflow_name, run.workflow_id)
    return RunStatus.SUSPENDED


def resume(ref: str | uuid.UUID) -> str:
    """Resume a suspended run: it becomes runnable and a worker continues it where it
    waits (a sleep whose time passed meanwhile ends at once). Raises
    ``InvalidTransition`` if the run is not suspended."""
    store = get_store()

    def transition(run: WorkflowRun) -> None:
        store.resume(run.pk, dispatched=delivers(get_dispatcher()))
        _dispatch_on_commit(str(run.pk))

    run = _on_live_run(ref, transition)
    logger.info("run %s (%s %s): resumed", run.pk, run.workflow_name, run.workflow_id)
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
        outcome = store.reactivate(run.pk, dispatched=delivers(get_dispatcher()))
        _dispatch_on_commit(str(run.pk))
    removed = outcome.removed_from
    logger.info("run %s (%s %s): retried%s", run.pk, run.workflow_name, run.workflow_id,
                f" from position {removed}" if removed is not None else "")  # fmt: skip
    return RunStatus.RUNNING
