"""Drive runs synchronously in the test process, on real time: :func:`drive` and the
pieces it is made of. The ``weft`` fixture (:mod:`django_weft.testing`) does the same on
a virtual clock.
"""

from __future__ import annotations

import time
import uuid

from ..conf import weft_settings
from ..engine.executor import Engine
from ..engine.records import TERMINAL_STATUSES, StepStatus
from ..models import Step, WorkflowRun
from ..runtime import CurrentDispatcher, run_activity, run_finalizer, tick
from ..runtime.dispatch import SweepOnlyDispatcher
from ..store import DjangoStore


def make_engine(engine_id: str | None = None) -> Engine:
    """A fresh engine with its own identity (two of them act like two worker processes)."""
    return Engine(DjangoStore().turns, CurrentDispatcher(), weft_settings.engine_config, engine_id=engine_id)


def run_queued_activities(run_id: str) -> int:
    """Run, in this thread, every queued activity attempt of ``run_id`` that is waiting
    for a worker; return how many ran."""
    pending = list(
        Step.objects.using(weft_settings.DATABASE_ALIAS)
        .filter(run_id=uuid.UUID(str(run_id)), status=StepStatus.SCHEDULED)
        .order_by("seq")
        .values_list("seq", "attempt")
    )
    for seq, attempt in pending:
        run_activity(str(run_id), seq, attempt)
    return len(pending)


def run_finalizer_now(run_id: str) -> str | None:
    """Run, in this thread, the pending (or retrying) finalizer attempt of ``run_id``, if
    any; return the finalizer's status afterwards (``None`` if the run has none)."""
    runs = WorkflowRun.objects.using(weft_settings.DATABASE_ALIAS)
    finalizer = runs.filter(pk=run_id).values_list("finalizer", flat=True).first()
    if not finalizer:
        return None
    if finalizer.get("status") in ("pending", "retrying"):
        run_finalizer(str(run_id), int(finalizer.get("attempt", 0)) + 1)
        finalizer = runs.filter(pk=run_id).values_list("finalizer", flat=True).first() or {}
    return str(finalizer.get("status"))


def drive(run_id: str, *, engine: Engine | None = None, timeout: float = 10.0) -> str:
    """Run turns of ``run_id`` (firing its timers as they come due, running its queued
    activities in this thread) until it is terminal; then its finalizer, if it has one
    to run (retries included, without waiting for their delays).

    Returns the final status; raises ``TimeoutError`` after ``timeout`` seconds.
    """
    engine = engine or make_engine()
    deadline = time.monotonic() + timeout
    sweep = SweepOnlyDispatcher()
    while True:
        engine.run_turn(str(run_id))
        run_queued_activities(str(run_id))
        status = (
            WorkflowRun.objects.using(weft_settings.DATABASE_ALIAS)
            .filter(pk=run_id)
            .values_list("status", flat=True)
            .first()
        )
        if status is None or status in TERMINAL_STATUSES:
            while run_finalizer_now(str(run_id)) in ("pending", "retrying"):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the finalizer of run {run_id} did not finish in {timeout} s")
            return str(status)
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still {status} after {timeout} s")
        tick(sweep)
        time.sleep(0.01)
