from __future__ import annotations

import uuid
from typing import ClassVar

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from ..engine.flow import PRIORITY_MAX, PRIORITY_MIN
from ..engine.records import ACTIVE_STATUSES, TERMINAL_STATUSES, FailureCategory, RunStatus
from .querysets import WorkflowRunQuerySet

WORKFLOW_ID_MAX_LENGTH = 255


class WorkflowRun(models.Model):
    """One execution of a workflow. Ownership columns are written only by ``store``."""

    class Status(models.TextChoices):
        PENDING = RunStatus.PENDING, _("pending")
        RUNNING = RunStatus.RUNNING, _("running")
        WAITING = RunStatus.WAITING, _("waiting")
        SUSPENDED = RunStatus.SUSPENDED, _("suspended")
        COMPLETED = RunStatus.COMPLETED, _("completed")
        FAILED = RunStatus.FAILED, _("failed")
        CANCELLED = RunStatus.CANCELLED, _("cancelled")
        TIMED_OUT = RunStatus.TIMED_OUT, _("timed out")
        CONTINUED = RunStatus.CONTINUED, _("continued")

    class FailureCategories(models.TextChoices):
        APPLICATION = FailureCategory.APPLICATION, _("application")
        ACTIVITY = FailureCategory.ACTIVITY, _("activity")
        NONDETERMINISM = FailureCategory.NONDETERMINISM, _("non-determinism")
        SYSTEM = FailureCategory.SYSTEM, _("system")
        CANCELLATION = FailureCategory.CANCELLATION, _("cancellation")
        TIMEOUT = FailureCategory.TIMEOUT, _("timeout")

    class Slot(models.TextChoices):
        NONE = "", _("none")
        QUEUED = "queued", _("queued")
        HELD = "held", _("held")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workflow_id = models.CharField(max_length=WORKFLOW_ID_MAX_LENGTH)
    # Indexed with created_at below; no single-column index (and no LIKE index): every
    # index is written on each change of the run row.
    workflow_name = models.CharField(max_length=200)
    workflow_version = models.CharField(max_length=50, blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    failure_category = models.CharField(
        max_length=16, choices=FailureCategories.choices, blank=True, default=""
    )
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="children",
        db_index=False,  # a partial index below: most runs have no parent
    )
    # A child run: its position in the parent's history and what happens to it when the
    # parent closes ("terminate", "request_cancel" or "abandon").
    parent_seq = models.IntegerField(null=True, blank=True)
    parent_close_policy = models.CharField(max_length=16, blank=True, default="")
    search_attributes = models.JSONField(default=dict, blank=True)
    # What the workflow recorded for its finalizer, and the finalizer's progress/outcome.
    finalizer_state = models.JSONField(null=True, blank=True)
    finalizer = models.JSONField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=1)
    execution_deadline = models.DateTimeField(null=True, blank=True)
    waiting_on = models.JSONField(null=True, blank=True)
    # The latest cancellation request (handle.cancel(mode="request")): reason, requested_at,
    # and seq, the position where the workflow received it (null while pending).
    cancel_request = models.JSONField(null=True, blank=True)
    # The trace context of the code that started the run (an opaque carrier filled by the
    # observers of django_weft.engine.observe), so its turns can join that trace.
    trace_context = models.JSONField(null=True, blank=True)
    # A reset (runtime.reset): on the new run, the run it was reset from; on that run, the
    # run that replaced it. Each {"run_id", "seq", "reason", "reset_at"}; no foreign key:
    # retention may purge either run, and the link then names a run no longer kept.
    reset_from = models.JSONField(null=True, blank=True)
    reset_to = models.JSONField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    # Flow control (docs/explanation/flow-control.md): the start's priority (-100..100,
    # higher first), and for a workflow with a concurrency limit the key it is counted by
    # ("" for one limit for the workflow; NULL without a limit), whether the run holds a
    # slot or is queued for one, and its place among the queued runs of its workflow.
    priority = models.SmallIntegerField(default=0, db_default=0)
    concurrency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001 - NULL means no limit
    slot = models.CharField(max_length=8, choices=Slot.choices, blank=True, default="", db_default="")
    queue_rank = models.BigIntegerField(null=True, blank=True)
    # Debounce (docs/explanation/flow-control.md): the key a debounced start was collapsed
    # by ("" for one burst per workflow; NULL: not a debounced start), and how many starts
    # the run collapsed (its own included).
    debounce_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001 - NULL means not debounced
    debounced_starts = models.PositiveIntegerField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    # Ownership (docs/explanation/guarantees.md): at most one owner; the epoch only ever grows.
    owner_id = models.CharField(max_length=100, null=True, blank=True)  # noqa: DJ001 - NULL means unowned
    owner_epoch = models.BigIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = WorkflowRunQuerySet.as_manager()

    class Meta:
        verbose_name = _("workflow run")
        verbose_name_plural = _("workflow runs")
        ordering: ClassVar = ["-created_at"]
        permissions: ClassVar = [
            ("signal_workflowrun", "Can send signals to workflow runs"),
            ("update_workflowrun", "Can send updates to workflow runs"),
            ("cancel_workflowrun", "Can cancel workflow runs"),
            ("suspend_workflowrun", "Can suspend and resume workflow runs"),
        ]
        constraints: ClassVar = [
            models.CheckConstraint(condition=Q(owner_epoch__gte=0), name="weft_run_epoch_non_negative"),
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in RunStatus]), name="weft_run_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                name="weft_run_priority_range",
            ),
            # One live run per business key; terminal runs keep the id for history.
            models.UniqueConstraint(
                fields=["workflow_id"],
                condition=Q(status__in=sorted(ACTIVE_STATUSES)),
                name="weft_run_one_active_per_workflow_id",
            ),
            # Debounce: one run per workflow and key collects starts at a time (pending, its
            # delayed start not fired yet, so holding no slot and queued for none).
            models.UniqueConstraint(
                fields=["workflow_name", "debounce_key"],
                condition=Q(debounce_key__isnull=False, status=RunStatus.PENDING, slot=""),
                name="weft_run_one_debounce_burst",
            ),
        ]
        indexes: ClassVar = [
            # The REST list's order (newest first, id as the tie-break): its first page and
            # every cursor page are index scans without a filter.
            models.Index(fields=["-created_at", "id"], name="weft_run_created"),
            models.Index(fields=["workflow_id", "-created_at"], name="weft_run_wfid_created"),
            models.Index(fields=["status", "-created_at"], name="weft_run_status_created"),
            models.Index(fields=["workflow_name", "-created_at"], name="weft_run_name_created"),
            # The admin's failure filter, in the list order: without it a rare category
            # reads the whole table. Only failed, cancelled and timed-out runs have a
            # category, so a run that completes writes no entry here.
            models.Index(
                fields=["failure_category", "-created_at", "id"],
                condition=~Q(failure_category=""),
                name="weft_run_failure_created",
            ),
            models.Index(fields=["parent"], condition=Q(parent__isnull=False), name="weft_run_parent"),
            # Runnable runs in the order workers take them: higher priority first, then
            # the longest waiting.
            models.Index(
                fields=["-priority", "ready_at"],
                condition=Q(status=RunStatus.RUNNING, owner_id__isnull=True),
                name="weft_run_runnable",
            ),
            # Flow control: the live runs of a limited workflow by key, so counting the
            # slots held reads only them; and the queue of runs waiting for a slot, in
            # the order they are let in.
            models.Index(
                fields=["workflow_name", "concurrency_key", "slot"],
                condition=Q(concurrency_key__isnull=False, status__in=sorted(ACTIVE_STATUSES)),
                name="weft_run_flow_live",
            ),
            # The run list filtered by a concurrency key (REST, admin), in the list's order:
            # only runs of limited workflows are in it.
            models.Index(
                fields=["concurrency_key", "-created_at", "id"],
                condition=Q(concurrency_key__isnull=False),
                name="weft_run_flow_key_created",
            ),
            models.Index(
                fields=["workflow_name", "concurrency_key", "-priority", "queue_rank", "created_at"],
                condition=Q(slot="queued", status=RunStatus.PENDING),
                name="weft_run_flow_queue",
            ),
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(owner_id__isnull=False),
                name="weft_run_owned_lease",
            ),
            # Terminal runs by status and last change: retention reads each status's due
            # runs as one range (status = s AND updated_at < cutoff, oldest first), so it
            # costs what is due; the finished-runs chart reads the recent end.
            models.Index(
                fields=["status", "updated_at"],
                condition=Q(status__in=sorted(TERMINAL_STATUSES)),
                name="weft_run_terminal_updated",
            ),
            # The same per workflow, for workflows with their own retention period.
            models.Index(
                fields=["workflow_name", "status", "updated_at"],
                condition=Q(status__in=sorted(TERMINAL_STATUSES)),
                name="weft_run_terminal_name",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workflow_name} {self.workflow_id} [{self.status}]"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES
