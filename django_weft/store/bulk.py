"""Bulk jobs' rows: created for ``runtime.start_bulk_job``, claimed by the tick with a
lease (taken under ``select_for_update(skip_locked=True)``), and advanced one batch at a
time by a write fenced on the claim's epoch."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q

from ..engine.errors import BulkJobNotFound
from ..models import BulkJob
from .sql import StoreSql

OPEN = (BulkJob.Status.PENDING, BulkJob.Status.RUNNING)


class BulkJobRows:
    """Bulk job rows; which runs a batch reaches, and what it does to them, is the runtime's."""

    def __init__(self, sql: StoreSql) -> None:
        self.sql = sql

    def _bulk_jobs(self) -> Any:
        return BulkJob.objects.using(self.sql.alias)

    def insert_bulk_job(self, fields: dict[str, Any]) -> BulkJob:
        return self._bulk_jobs().create(**fields)

    def read_bulk_job(self, job_id: str | uuid.UUID) -> BulkJob:
        """The job; ``BulkJobNotFound`` if there is none with this id."""
        try:
            key = job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id))
        except ValueError:
            key = None
        found = self._bulk_jobs().filter(pk=key).first() if key is not None else None
        if found is None:
            raise BulkJobNotFound(f"no bulk job with id {str(job_id)!r}", job_id=str(job_id))
        return found

    def bulk_jobs_open(self) -> bool:
        """Whether any job is pending or running: one read on a partial index, no lock and
        no transaction, so a tick with no job stops here."""
        return bool(self.open_jobs().exists())

    def open_jobs(self) -> Any:
        """The jobs pending or running, unlocked."""
        return self._bulk_jobs().filter(status__in=OPEN)

    def claim_bulk_job(self, lease: timedelta) -> BulkJob | None:
        """Take the oldest open job that no other process holds, for ``lease``: its status
        becomes running and its epoch grows (the job returned carries the new one). The
        row lock lasts only for this short transaction; the lease keeps the job this
        process's while it works on a batch, and expires if the process dies."""
        with transaction.atomic(using=self.sql.alias):
            now = self.sql.db_now()
            job: BulkJob | None = (
                self._bulk_jobs()
                .filter(status__in=OPEN)
                .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
                .order_by("created_at")
                .select_for_update(skip_locked=True)
                .first()
            )
            if job is None:
                return None
            job.status = BulkJob.Status.RUNNING
            job.epoch += 1
            job.lease_expires_at = now + lease
            job.updated_at = now
            job.save(
                using=self.sql.alias, update_fields=["status", "epoch", "lease_expires_at", "updated_at"]
            )
            return job

    def _held_bulk_job(self, job_id: uuid.UUID, epoch: int) -> BulkJob | None:
        """The job locked, if the claim of ``epoch`` still holds it (else ``None``: its lease
        ran out and another process claimed it, which redoes the batch)."""
        job: BulkJob | None = (
            self._bulk_jobs()
            .select_for_update()
            .filter(pk=job_id, epoch=epoch, status=BulkJob.Status.RUNNING)
            .first()
        )
        return job

    def record_bulk_batch(
        self,
        job_id: uuid.UUID,
        epoch: int,
        *,
        done: int,
        skipped: Sequence[tuple[str, Sequence[str]]],
        failures: Sequence[dict[str, str]],
        cursor: uuid.UUID | None,
        finished: bool,
        listed: int,
    ) -> bool:
        """Add a batch's outcome to the job, move its cursor past the batch and release its
        lease (completing it if ``finished``), in one transaction; ``False``, writing
        nothing, if the claim of ``epoch`` no longer holds it.

        ``skipped`` is ``(reason, run ids)`` in the order met; each reason keeps a count
        and up to ``listed`` run ids, and the job up to ``listed`` failures."""
        with transaction.atomic(using=self.sql.alias):
            job = self._held_bulk_job(job_id, epoch)
            if job is None:
                return False
            now = self.sql.db_now()
            reasons: list[dict[str, Any]] = list(job.skipped_reasons or [])
            by_reason = {entry["reason"]: entry for entry in reasons}
            for reason, run_ids in skipped:
                entry = by_reason.get(reason)
                if entry is None:
                    entry = by_reason[reason] = {"reason": reason, "count": 0, "run_ids": []}
                    reasons.append(entry)
                entry["count"] += len(run_ids)
                entry["run_ids"] = [*entry["run_ids"], *run_ids][:listed]
            job.skipped_reasons = reasons
            job.failures = [*(job.failures or []), *failures][:listed]
            job.done += done
            job.skipped += sum(len(run_ids) for _, run_ids in skipped)
            job.failed += len(failures)
            job.cursor = cursor
            job.lease_expires_at = None
            job.updated_at = now
            if finished:
                job.status = BulkJob.Status.COMPLETED
                job.finished_at = now
            job.save(using=self.sql.alias)
            return True

    def fail_bulk_job(self, job_id: uuid.UUID, epoch: int, error: str) -> bool:
        """End the job as failed with ``error`` (why it cannot go on); ``False`` if the claim
        of ``epoch`` no longer holds it."""
        with transaction.atomic(using=self.sql.alias):
            job = self._held_bulk_job(job_id, epoch)
            if job is None:
                return False
            now = self.sql.db_now()
            job.status = BulkJob.Status.FAILED
            job.error = error
            job.lease_expires_at = None
            job.finished_at = job.updated_at = now
            job.save(
                using=self.sql.alias,
                update_fields=["status", "error", "lease_expires_at", "finished_at", "updated_at"],
            )
            return True
