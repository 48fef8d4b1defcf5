from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from ..engine.schedule_firing import OverlapPolicy
from ..engine.schedule_spec import CRON_MAX_LENGTH

SCHEDULE_ID_MAX_LENGTH = 200
"""A schedule's id is the first part of its runs' workflow ids (``<id>-<UTC time>``,
21 more characters), which must stay within ``WORKFLOW_ID_MAX_LENGTH``."""


class Schedule(models.Model):
    """Recurring starts of one workflow. The tick fires due schedules (``next_fire_at``
    passed, not paused); only the runtime's schedule functions write these rows."""

    class Overlap(models.TextChoices):
        SKIP = OverlapPolicy.SKIP, _("skip")
        BUFFER_ONE = OverlapPolicy.BUFFER_ONE, _("buffer one")
        BUFFER_ALL = OverlapPolicy.BUFFER_ALL, _("buffer all")
        CANCEL_OTHER = OverlapPolicy.CANCEL_OTHER, _("cancel other")
        TERMINATE_OTHER = OverlapPolicy.TERMINATE_OTHER, _("terminate other")
        ALLOW_ALL = OverlapPolicy.ALLOW_ALL, _("allow all")

    id = models.SlugField(primary_key=True, max_length=SCHEDULE_ID_MAX_LENGTH)
    workflow_name = models.CharField(max_length=200)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    search_attributes = models.JSONField(default=dict, blank=True)
    # The spec: a cron expression in a time zone, or an interval with an offset.
    cron = models.CharField(max_length=CRON_MAX_LENGTH, blank=True, default="")
    timezone = models.CharField(max_length=64, default="UTC")
    every_seconds = models.FloatField(null=True, blank=True)
    offset_seconds = models.FloatField(default=0.0)
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)
    jitter_seconds = models.FloatField(default=0.0)
    # Policies.
    overlap = models.CharField(max_length=16, choices=Overlap.choices, default=Overlap.SKIP)
    catchup_window_seconds = models.FloatField(default=60.0)
    paused = models.BooleanField(default=False)
    note = models.TextField(blank=True, default="")
    managed = models.BooleanField(
        default=False, help_text=_("Declared in code and kept in step by `manage.py weft_schedules sync`.")
    )
    # State, written by the tick.
    next_fire_at = models.DateTimeField(null=True, blank=True)
    buffered = models.JSONField(
        default=list,
        blank=True,
        help_text=_("Scheduled times (UTC, ISO 8601) waiting for the open run to finish."),
    )
    buffered_count = models.PositiveIntegerField(default=0)
    latest_workflow_id = models.CharField(
        max_length=255, blank=True, default="", help_text=_("The workflow id of the schedule's latest run.")
    )
    fired_count = models.PositiveBigIntegerField(default=0)
    skipped_count = models.PositiveBigIntegerField(
        default=0, help_text=_("Fires skipped by the overlap policy.")
    )
    missed_count = models.PositiveBigIntegerField(
        default=0, help_text=_("Fires older than the catch-up window.")
    )
    last_missed_at = models.DateTimeField(null=True, blank=True)
    recent_actions = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("schedule")
        verbose_name_plural = _("schedules")
        ordering: ClassVar = ["id"]
        indexes: ClassVar = [
            # The tick's claim: due, not paused, oldest first. Paused and ended schedules
            # (no next fire) are not in it.
            models.Index(
                fields=["next_fire_at"],
                condition=Q(paused=False, next_fire_at__isnull=False),
                name="weft_schedule_due",
            ),
            # Schedules holding buffered fires, checked each tick until their run ends.
            models.Index(fields=["id"], condition=Q(buffered_count__gt=0), name="weft_schedule_buffered"),
        ]
        permissions: ClassVar = [
            ("pause_schedule", "Can pause and unpause schedules"),
            ("trigger_schedule", "Can trigger and backfill schedules"),
        ]

    def __str__(self) -> str:
        return self.id
