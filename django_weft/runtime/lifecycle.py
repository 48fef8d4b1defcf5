"""Lifecycle operations on a run, from any process: cancel, suspend, resume, retry."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from django.db import transaction

from ..conf import weft_settings
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


def cancel(ref: str | uuid.UUID, reason: str | None = None) -> str:
    """Cancel a run now: it is ``cancelled`` durably on return, whichever process drives
    it (that worker is deposed at its next write and stops), its pending timers are
    removed and its pending updates failed; ``result()`` raises ``WorkflowCancelled``.
    Works on suspended runs; raises ``WorkflowTerminalError`` for a finished run."""
    if reason is not None and not isinstance(reason, str):
        raise InvalidInput(f"reason must be a string; got {type(reason).__name__}")
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
    for child in store.close_children(str(run.pk), f"its parent run {run.pk} was cancelled"):
        logger.info("run %s: cancelled, its parent run %s was cancelled", child, run.pk)
    return RunStatus.CANCELLED


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
