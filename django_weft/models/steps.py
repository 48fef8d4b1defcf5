from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from ..engine.records import StepKind, StepStatus


class Step(models.Model):
    """One recorded durable operation of a run, at position ``seq``."""

    class Kind(models.TextChoices):
        ACTIVITY = StepKind.ACTIVITY, _("activity")
        SLEEP = StepKind.SLEEP, _("sleep")
        SIDE_EFFECT = StepKind.SIDE_EFFECT, _("side effect")
        PATCH = StepKind.PATCH, _("patch marker")
        WAIT = StepKind.WAIT, _("wait for any")
        SIGNAL = StepKind.SIGNAL, _("wait for a signal")
        CONDITION = StepKind.CONDITION, _("wait for a condition")
        HANDLER = StepKind.HANDLER, _("handler")
        CHILD = StepKind.CHILD, _("child workflow")
        SEARCH_ATTRIBUTES = StepKind.SEARCH_ATTRIBUTES, _("search attributes")
        CANCEL_REQUEST = StepKind.CANCEL_REQUEST, _("cancellation request")

    class Status(models.TextChoices):
        COMPLETED = StepStatus.COMPLETED, _("completed")
        FAILED = StepStatus.FAILED, _("failed")
        WAITING = StepStatus.WAITING, _("waiting")
        RETRYING = StepStatus.RETRYING, _("retrying")
        SCHEDULED = StepStatus.SCHEDULED, _("scheduled")
        STARTED = StepStatus.STARTED, _("started")
        ATTEMPT_FAILED = StepStatus.ATTEMPT_FAILED, _("attempt failed")
        LOST = StepStatus.LOST, _("lost")
        DELAYED = StepStatus.DELAYED, _("delayed")

    id = models.BigAutoField(primary_key=True)
    # No separate index on run: the unique (run, seq) index serves lookups by run, and
    # one index less is cheaper on the hot insert.
    run = models.ForeignKey(
        "django_weft.WorkflowRun", on_delete=models.CASCADE, related_name="steps", db_index=False
    )
    seq = models.IntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=Status.choices)
    args = models.JSONField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=1)
    # The owner epoch that first recorded this position (a later rewrite of the row keeps
    # it; 0 for a step copied by a reset). Evidence for the fencing guarantee
    # (docs/explanation/guarantees.md): a run's steps, in the order they were inserted,
    # never go back to an older epoch. A database default, so that a worker of the
    # previous release, which does not name the column, can still insert during an upgrade.
    epoch = models.BigIntegerField(default=0, db_default=0)
    # An activity's attempts that failed and were retried, oldest first (``attempt``,
    # ``error``, ``started_at``, ``finished_at``): the step itself holds the last attempt.
    failed_attempts = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("step")
        verbose_name_plural = _("steps")
        ordering: ClassVar = ["run", "seq"]
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["run", "seq"], name="weft_step_unique_seq"),
            models.CheckConstraint(condition=Q(seq__gte=0), name="weft_step_seq_non_negative"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind} {self.name} [{self.status}]"
