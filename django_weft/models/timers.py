from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from ..engine.records import TimerKind
from .querysets import TimerQuerySet


class Timer(models.Model):
    """A durable wake-up. ``seq`` is the step that waits, or -1 for run-level timers."""

    class Kind(models.TextChoices):
        SLEEP = TimerKind.SLEEP, _("sleep")
        SIGNAL_TIMEOUT = TimerKind.SIGNAL_TIMEOUT, _("signal timeout")
        RETRY = TimerKind.RETRY, _("retry")
        DEADLINE = TimerKind.DEADLINE, _("deadline")
        DELAYED_START = TimerKind.DELAYED_START, _("delayed start")
        SCHEDULE = TimerKind.SCHEDULE, _("schedule")
        ACTIVITY = TimerKind.ACTIVITY, _("queued activity deadline")
        FINALIZER = TimerKind.FINALIZER, _("finalizer")

    id = models.BigAutoField(primary_key=True)
    # The unique (run, seq, kind) index serves lookups by run.
    run = models.ForeignKey(
        "django_weft.WorkflowRun", on_delete=models.CASCADE, related_name="timers", db_index=False
    )
    seq = models.IntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    fire_at = models.DateTimeField()
    fired_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TimerQuerySet.as_manager()

    class Meta:
        verbose_name = _("timer")
        verbose_name_plural = _("timers")
        ordering: ClassVar = ["fire_at"]
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["run", "seq", "kind"], name="weft_timer_unique_per_step"),
        ]
        indexes: ClassVar = [
            models.Index(fields=["fire_at"], condition=Q(fired_at__isnull=True), name="weft_timer_unfired"),
            # The due timers of one kind (the finalizers' sweep and its probe): without it,
            # finding the first due finalizer walks every due timer of the other kinds,
            # all 10,000 of them when that many sleeps end together.
            models.Index(
                fields=["kind", "fire_at"], condition=Q(fired_at__isnull=True), name="weft_timer_kind_due"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} at {self.fire_at:%Y-%m-%d %H:%M:%S}"
