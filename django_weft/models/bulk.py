from __future__ import annotations

import uuid
from typing import ClassVar

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _


class BulkJob(models.Model):
    """A lifecycle operation on every run a filter matches, worked through by the tick a
    batch at a time (``runtime.process_bulk_jobs``) and read back as progress. Only the
    store writes these rows."""

    class Status(models.TextChoices):
        PENDING = "pending", _("pending")
        RUNNING = "running", _("running")
        COMPLETED = "completed", _("completed")
        FAILED = "failed", _("failed")

    class Action(models.TextChoices):
        CANCEL = "cancel", _("cancel")
        SUSPEND = "suspend", _("suspend")
        RESUME = "resume", _("resume")
        RETRY = "retry", _("retry")
        TERMINATE = "terminate", _("terminate")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    action = models.CharField(max_length=16, choices=Action.choices)
    filter = models.JSONField(default=dict, blank=True, help_text=_("The filter as the caller gave it."))
    runs_from = models.CharField(
        max_length=200,
        help_text=_("Name of the run source (django_weft.runtime.run_sources) that reads the filter."),
    )
    as_of = models.DateTimeField(help_text=_("Runs created after this time are left alone."))
    reason = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    matched = models.PositiveBigIntegerField(
        null=True, blank=True, help_text=_("Runs the filter matched when the job was created.")
    )
    done = models.PositiveBigIntegerField(default=0)
    skipped = models.PositiveBigIntegerField(default=0)
    failed = models.PositiveBigIntegerField(default=0)
    skipped_reasons = models.JSONField(
        default=list, blank=True, help_text=_('[{"reason", "count", "run_ids"}], run ids capped per reason.')
    )
    failures = models.JSONField(
        default=list, blank=True, help_text=_('[{"run_id", "workflow_id", "error"}], capped.')
    )
    error = models.TextField(blank=True, default="", help_text=_("Why the job failed as a whole."))
    # Progress and ownership: the last run id reached (runs are taken in id order), and
    # the lease of the process working on the next batch (its epoch fences its write).
    cursor = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    epoch = models.BigIntegerField(default=0)
    created_by = models.CharField(
        max_length=255, blank=True, default="", help_text=_("The username of who started the job.")
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("bulk job")
        verbose_name_plural = _("bulk jobs")
        ordering: ClassVar = ["-created_at"]
        indexes: ClassVar = [
            # The tick's question "is there an open job?" reads this, not the finished jobs.
            models.Index(
                fields=["created_at"],
                condition=Q(status__in=["pending", "running"]),
                name="weft_bulkjob_open",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.pk} [{self.status}]"
