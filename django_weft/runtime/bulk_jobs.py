"""Bulk jobs: a lifecycle operation on every run a filter matches, durable, worked through
by the tick a batch at a time (the REST route ``POST runs/bulk/``).

:func:`start_bulk_job` stores the job and returns at once; nothing loops over the runs in
the caller's request. :func:`process_bulk_jobs`, called by every ``tick``, leases the
oldest open job, reads its next batch of matching runs after the job's cursor (runs are
taken in id order) and hands them to :func:`.bulk.apply_bulk`, the function the admin's
actions use; then it adds the batch's outcome to the job and moves the cursor, in one
write fenced on the lease's epoch. The job completes when a batch comes back short.

How a job finds its runs again. The job stores its filter as the caller gave it and the
name of a run source (``runs_from``), a function ``(job) -> WorkflowRun queryset`` in the
registry of :mod:`.run_sources`, which turns that filter into a queryset each time a
batch is read; only runs created up to the job's ``as_of`` are taken. Storing the
matching run ids would be a row per run before the job starts, so the filter is read
again; and the source is named, not imported from a path in the row, so the tick runs
only code the runtime registered (the REST jobs' source, ``"runs_list"``, evaluates the
list's filters here) and a renamed module cannot strand a job. Python callers use
``"lookups"`` (ORM lookups, the default) or register their own.

Restart-safe: a process that dies mid-batch leaves its lease to expire
(:data:`LEASE`), and the next tick redoes the batch from the cursor. Each run changes at
most once (a run already changed is skipped by the lifecycle rules); the redone batch
counts the runs the dead process had changed as skipped ("already finished (cancelled)").
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import FieldError
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DatabaseError
from django.db.models import QuerySet

from ..conf import weft_settings
from ..engine import codec
from ..engine.errors import InvalidInput, PayloadError, WeftError
from ..engine.run_logging import get_logger
from ..models import BulkJob, WorkflowRun
from .bulk import apply_bulk, count_runs, operation_named
from .process import get_store
from .run_sources import LOOKUPS, run_source

logger = get_logger("django_weft.runtime")

LEASE = timedelta(minutes=2)
"""How long a process holds a job while it works on one batch (a batch of
``WEFT_TICK_BATCH`` runs takes seconds); a process that dies releases it by expiry."""
RUN_IDS_LISTED = 100
"""Run ids a job keeps per skip reason, and failures it keeps; the counts are complete."""
USERNAME_MAX_LENGTH = BulkJob._meta.get_field("created_by").max_length or 255


@dataclass(frozen=True)
class BulkJobRecord:
    """A bulk job and its progress, as :func:`get_bulk_job` reads it."""

    id: str
    action: str
    filter: dict[str, Any]
    reason: str
    status: str
    """``pending``, ``running``, ``completed`` or ``failed`` (``error`` says why)."""
    as_of: datetime
    """Runs created after this time are left alone."""
    matched: int | None
    """Runs matching when the job was created. The filter is read again batch by batch:
    a run that has left it by then is not reached, one that has entered it may be."""
    done: int
    skipped: int
    failed: int
    skipped_reasons: list[dict[str, Any]]
    """``{"reason", "count", "run_ids"}`` per reason, in the order first met; up to
    :data:`RUN_IDS_LISTED` run ids each."""
    failures: list[dict[str, str]]
    """``{"run_id", "workflow_id", "error"}``, up to :data:`RUN_IDS_LISTED`."""
    error: str
    created_by: str
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    @property
    def reached(self) -> int:
        """Runs done, skipped or failed so far."""
        return self.done + self.skipped + self.failed

    @property
    def finished(self) -> bool:
        return self.status in (BulkJob.Status.COMPLETED, BulkJob.Status.FAILED)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _record(job: BulkJob) -> BulkJobRecord:
    return BulkJobRecord(
        id=str(job.pk),
        action=job.action,
        filter=dict(job.filter or {}),
        reason=job.reason,
        status=job.status,
        as_of=job.as_of,
        matched=job.matched,
        done=job.done,
        skipped=job.skipped,
        failed=job.failed,
        skipped_reasons=list(job.skipped_reasons or []),
        failures=list(job.failures or []),
        error=job.error,
        created_by=job.created_by,
        created_at=job.created_at,
        updated_at=job.updated_at,
        finished_at=job.finished_at,
    )


def runs_of_job(job: BulkJob) -> QuerySet[WorkflowRun]:
    """The runs ``job`` acts on now: its ``runs_from`` applied to its filter, created up to
    its ``as_of``. Raises ``InvalidInput`` (or the function's own ``WeftError``) when the
    filter cannot be applied."""
    function = run_source(job.runs_from)
    try:
        runs = function(job)
        if not isinstance(runs, QuerySet) or runs.model is not WorkflowRun:
            raise InvalidInput(f"runs_from {job.runs_from!r} must return a WorkflowRun queryset")
        if runs.query.is_sliced:
            raise InvalidInput(f"runs_from {job.runs_from!r} returned a sliced queryset; filter it instead")
        return runs.filter(created_at__lte=job.as_of)
    except WeftError:
        raise
    except (FieldError, DjangoValidationError, ValueError, TypeError) as exc:
        raise InvalidInput(f"the filter cannot be applied: {exc}", field="filter") from None


def start_bulk_job(
    action: str,
    filter: Mapping[str, Any] | None = None,
    *,
    reason: str | None = None,
    user: str = "",
    runs_from: str = LOOKUPS,
    as_of: datetime | None = None,
) -> BulkJobRecord:
    """Store a job that applies ``action`` ("cancel", "terminate", "suspend", "resume" or
    "retry") to every run ``runs_from`` finds for ``filter``, created up to ``as_of``
    (default: now, on the database clock), and return it, pending. The tick works through
    it (:func:`process_bulk_jobs`); :func:`get_bulk_job` reads its progress.

    ``filter`` is stored as given (JSON) and handed to ``runs_from``, the name of a run
    source (:mod:`.run_sources`: ``"lookups"``, the default, takes the filter as ORM
    lookups; ``"runs_list"`` as the REST list's filters), called for each batch. It is
    called once here too, to count the runs matching now (``matched``): one ``COUNT`` on
    an explicit request to act on all of them, which also refuses a filter that cannot be
    applied before anything is stored.

    ``reason`` is for cancel and terminate; ``user`` (a username) is recorded as
    ``created_by``. Raises ``InvalidInput`` (with ``field`` naming the argument at fault)
    before storing anything."""
    try:
        operation = operation_named(action)
    except InvalidInput as exc:
        raise InvalidInput(exc.message, field="action") from None
    reason = operation.described.check_reason(reason)
    spec = {} if filter is None else filter
    if not isinstance(spec, Mapping) or not all(isinstance(key, str) for key in spec):
        raise InvalidInput("filter must be a dict with string keys", field="filter")
    spec = _checked_json(dict(spec), "filter")
    if not isinstance(user, str) or len(user) > USERNAME_MAX_LENGTH:
        raise InvalidInput(
            f"user must be a username (a string of at most {USERNAME_MAX_LENGTH} characters)", field="user"
        )
    store = get_store()
    job = BulkJob(
        id=uuid.uuid4(),
        action=operation.name,
        filter=spec,
        runs_from=runs_from,
        as_of=as_of or store.db_now(),
        reason=reason or "",
        created_by=user,
    )
    job.matched = count_runs(runs_of_job(job))
    fields = {field.attname: getattr(job, field.attname) for field in BulkJob._meta.concrete_fields}
    for automatic in ("created_at", "updated_at"):
        fields.pop(automatic)
    created = store.bulk_jobs.insert_bulk_job(fields)
    logger.info(
        "bulk job %s: %s of %d runs matching %s, by %s",
        created.pk,
        created.action,
        created.matched or 0,
        codec.dumps(spec),
        user or "(unnamed)",
    )
    return _record(created)


def _checked_json(value: Any, what: str) -> Any:
    """``value`` as it will be stored (no NUL, no lone surrogate, within
    ``WEFT_MAX_PAYLOAD_BYTES``), or ``InvalidInput`` naming it."""
    try:
        return codec.loads(codec.dumps(value, what=what, limit=weft_settings.MAX_PAYLOAD_BYTES))
    except PayloadError as exc:
        raise InvalidInput(exc.message, field=what) from None


def get_bulk_job(job_id: str | uuid.UUID) -> BulkJobRecord:
    """The job and its progress; ``BulkJobNotFound`` if there is no such job."""
    return _record(get_store().bulk_jobs.read_bulk_job(job_id))


def process_bulk_jobs(batch: int | None = None) -> int:
    """Work on one batch of the oldest open job that no other process holds: up to
    ``batch`` (default ``WEFT_TICK_BATCH``) of its runs after its cursor, each changed by
    :func:`.bulk.apply_bulk` in a transaction of its own. Returns the runs reached
    (changed, skipped or failed); 0 when there was nothing to do.

    Called by ``tick``; safe from several processes at once (the job is leased under
    ``SKIP LOCKED``, and the write of the batch's outcome is fenced on the lease's
    epoch). A job whose filter can no longer be applied (its ``runs_from`` or the run
    filter it applies raises) ends as failed with the error; a database error leaves the
    job to the next tick once the lease expires. Call it outside a transaction."""
    size = batch or weft_settings.TICK_BATCH
    store = get_store()
    if not store.bulk_jobs.bulk_jobs_open():
        return 0
    job = store.bulk_jobs.claim_bulk_job(LEASE)
    if job is None:
        return 0
    try:
        runs = runs_of_job(job)
        if job.cursor is not None:
            runs = runs.filter(pk__gt=job.cursor)
        ids: list[uuid.UUID] = list(runs.order_by("pk").values_list("pk", flat=True)[:size])
        # Each run's own error is caught inside; what reaches here is about the job.
        outcome = apply_bulk(job.action, ids, reason=job.reason or None, batch_size=size)
    except DatabaseError:
        raise  # the lease expires and a later tick tries again
    except Exception as exc:
        error = exc.message if isinstance(exc, WeftError) else f"{type(exc).__name__}: {exc}"
        logger.exception("bulk job %s: cannot go on (its runs cannot be read); the job fails", job.pk)
        store.bulk_jobs.fail_bulk_job(job.pk, job.epoch, error)
        return 0
    recorded = store.bulk_jobs.record_bulk_batch(
        job.pk,
        job.epoch,
        done=len(outcome.changed),
        skipped=[(reason, [run.run_id for run in runs]) for reason, runs in outcome.skipped.items()],
        failures=[
            {"run_id": failure.run.run_id, "workflow_id": failure.run.workflow_id, "error": failure.error}
            for failure in outcome.failed
        ],
        cursor=ids[-1] if ids else job.cursor,
        finished=len(ids) < size,
        listed=RUN_IDS_LISTED,
    )
    if not recorded:
        logger.warning(
            "bulk job %s: another process took the job over during a batch; it redoes that batch", job.pk
        )
    elif len(ids) < size:
        logger.info("bulk job %s: completed", job.pk)
    return outcome.total
