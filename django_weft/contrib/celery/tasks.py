"""The Celery tasks: thin shims over :mod:`django_weft.runtime` that take ids only.

Turns and activities are ``acks_late`` with ``reject_on_worker_lost``: a message is
acknowledged after its work is recorded, and one whose worker died goes back to the
queue. Redelivery is harmless (the claim and the attempt fence make a second delivery a
no-op), and so is a lost message: the database holds the work and the sweep finds it.
"""

from __future__ import annotations

import time

from celery import shared_task

from ... import runtime
from ...conf import weft_settings
from ...engine.run_logging import get_logger
from ...runtime.outages import DATABASE_UNAVAILABLE, database_unavailable
from . import ACTIVITY_TASK, GC_TASK, TICK_TASK, TURN_TASK
from .signals import start_advertising

logger = get_logger("django_weft.celery")

_DURABLE = {"acks_late": True, "reject_on_worker_lost": True, "ignore_result": True, "serializer": "json"}


@shared_task(name=TURN_TASK, **_DURABLE)
def run_turn(run_id: str) -> str:
    """Claim the run and drive it until it parks or finishes. A run of a workflow not
    registered in this worker is not claimed: the message is acknowledged and the run
    left, unowned, to the sweep, which sends it again (docs/explanation/decisions.md)."""
    start_advertising()
    return str(runtime.run_turn(run_id))


@shared_task(name=ACTIVITY_TASK, **_DURABLE)
def run_activity(run_id: str, seq: int, attempt: int) -> str:
    """Run one attempt of a queued activity and record its outcome."""
    start_advertising()
    return str(runtime.run_activity(run_id, int(seq), int(attempt)))


#: Takeovers a tick drives itself, in its own process, before it returns.
TICK_LOCAL_TAKEOVERS = 10


@shared_task(name=TICK_TASK, ignore_result=True, serializer="json")
def tick() -> dict[str, int]:
    """The sweep: fire due timers, dispatch runnable runs and expired leases.

    Runs whose worker died are also driven right here (up to ``TICK_LOCAL_TAKEOVERS``,
    starting new ones for half a tick interval), racing their queued messages: recovery
    then does not wait behind a busy queue. The claim decides who drives each run; the
    loser's attempt is a no-op. Give this task no time limits shorter than a turn.

    While the database is away the sweep logs one line and returns: the next beat's tick
    tries again, on a new connection (``signals.drop_broken_connections``)."""
    try:
        report = runtime.tick()
    except DATABASE_UNAVAILABLE as exc:
        if not database_unavailable(exc):
            raise  # the code or the schema is wrong: a bug to see, not an outage
        logger.warning("tick: the database is not answering (%s); the next tick retries", exc)
        return {"fired": 0, "dispatched": 0, "purged": 0}
    if report.fired or report.dispatched:
        logger.info("tick: fired %d timers, dispatched %d runs", report.fired, report.dispatched)
    if report.taken_over:
        start_advertising()
        # A budget, so a slow takeover does not hold up the next sweeps of this process:
        # the runs not driven here are in the queue already.
        budget_ends = time.monotonic() + weft_settings.TICK_INTERVAL / 2
        for run_id in report.taken_over[:TICK_LOCAL_TAKEOVERS]:
            if time.monotonic() > budget_ends:
                break
            outcome = runtime.run_turn(run_id)
            logger.info("tick: took over run %s (%s)", run_id, outcome)
    return {"fired": report.fired, "dispatched": report.dispatched, "purged": report.purged}


@shared_task(name=GC_TASK, ignore_result=True, serializer="json")
def gc() -> dict[str, int]:
    """Retention: delete every terminal run past its retention, ``WEFT_TICK_BATCH`` runs
    per transaction (``runtime.purge_expired``). The beat sends it every ``GC_INTERVAL``;
    two at once share the work (``SKIP LOCKED``)."""
    report = runtime.purge_expired()
    if report.batches:
        logger.info("gc: %s", report.summary())
    return {"purged": report.purged_total, "kept": report.kept.total()}
