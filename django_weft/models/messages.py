from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _


class Signal(models.Model):
    """A message sent to a run, buffered until the workflow consumes it (FIFO per name)."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey("django_weft.WorkflowRun", on_delete=models.CASCADE, related_name="signals")
    name = models.CharField(max_length=200)
    payload = models.JSONField(null=True, blank=True)
    signal_id = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001 - unique when given
    received_at = models.DateTimeField(auto_now_add=True)
    consumed_seq = models.IntegerField(null=True, blank=True)
    # The sender's trace context (a W3C carrier; NULL without tracing), which the span of
    # the turn that consumes the signal links to.
    trace_context = models.JSONField(null=True, blank=True)

    class Meta:
        verbose_name = _("signal")
        verbose_name_plural = _("signals")
        ordering: ClassVar = ["run", "id"]
        constraints: ClassVar = [
            models.UniqueConstraint(
                fields=["run", "name", "signal_id"],
                condition=Q(signal_id__isnull=False),
                name="weft_signal_unique_signal_id",
            ),
        ]
        indexes: ClassVar = [
            models.Index(
                fields=["run", "name", "id"],
                condition=Q(consumed_seq__isnull=True),
                name="weft_signal_unconsumed",
            ),
        ]

    def __str__(self) -> str:
        return f"signal {self.name} #{self.pk}"


class UpdateStatus(models.TextChoices):
    ACCEPTED = "accepted", _("accepted")
    COMPLETED = "completed", _("completed")
    FAILED = "failed", _("failed")
    REJECTED = "rejected", _("rejected")


class Update(models.Model):
    """A request/response message: accepted, applied by the workflow, answered."""

    id = models.BigAutoField(primary_key=True)
    update_id = models.CharField(max_length=200)
    # The unique (run, update_id) index serves lookups by run.
    run = models.ForeignKey(
        "django_weft.WorkflowRun", on_delete=models.CASCADE, related_name="updates", db_index=False
    )
    name = models.CharField(max_length=200)
    payload = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=UpdateStatus.choices, default=UpdateStatus.ACCEPTED)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    applied_seq = models.IntegerField(null=True, blank=True)
    # False for an update accepted before the run had registered its handler: the run
    # validates it when it gets to a blocking point with that handler.
    validated = models.BooleanField(default=True)
    # The sender's trace context (a W3C carrier; NULL without tracing), which the span of
    # the turn that applies the update links to.
    trace_context = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("update")
        verbose_name_plural = _("updates")
        ordering: ClassVar = ["run", "id"]
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["run", "update_id"], name="weft_update_unique_update_id"),
        ]
        indexes: ClassVar = [
            models.Index(fields=["run", "id"], condition=Q(status="accepted"), name="weft_update_pending"),
        ]

    def __str__(self) -> str:
        return f"update {self.name} {self.update_id} [{self.status}]"
