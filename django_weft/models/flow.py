"""Flow control's rows for activities: rate limit buckets and activity concurrency slots
(docs/explanation/flow-control.md). A workflow's concurrency slots are columns of its
runs (:class:`~.runs.WorkflowRun`)."""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _


class RateLimitBucket(models.Model):
    """The state of one rate limit bucket (a named limit, and a key of it): the moment its
    next attempt is due, advanced by one statement per attempt (a generic cell rate
    algorithm). A bucket idle for an hour is deleted (it would give the next attempt the
    same moment as no bucket)."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=100)
    key = models.CharField(max_length=255, blank=True, default="")
    # The theoretical arrival time, in microseconds since the epoch: an integer so that
    # PostgreSQL and SQLite do the same arithmetic on it in the statement itself.
    tat = models.BigIntegerField()

    class Meta:
        verbose_name = _("rate limit bucket")
        verbose_name_plural = _("rate limit buckets")
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["name", "key"], name="weft_rate_limit_unique_bucket"),
        ]
        # No index on tat: every attempt moves it, and an index on it would make each of
        # those updates write the indexes too (no in-place, heap-only update). The table
        # holds a row per bucket used in the last hour (the sweep's retention forgets the
        # rest), so the dashboard's and the clean-up's ranges of tat read it whole.

    def __str__(self) -> str:
        return f"{self.name} {self.key}".strip()


class ActivitySlot(models.Model):
    """An activity attempt counted by its activity's concurrency limit: holding a slot
    (``held``, until ``lease_expires_at`` unless its worker renews it), or queued for one
    (``waiting``, first come first served). One row per attempt position of a run.

    ``holder`` names the execution of the attempt running on a held slot: only it renews
    and gives back that slot, so an earlier execution that outlived its run's lease
    cannot free or keep alive the slot of the one that replaced it. It is empty on a
    waiting row and on a slot handed on and not yet taken up."""

    class State(models.TextChoices):
        HELD = "held", _("held")
        WAITING = "waiting", _("waiting")

    id = models.BigAutoField(primary_key=True)
    activity = models.CharField(max_length=200)
    key = models.CharField(max_length=255, blank=True, default="")
    # The unique (run, seq) index serves lookups by run.
    run = models.ForeignKey(
        "django_weft.WorkflowRun", on_delete=models.CASCADE, related_name="activity_slots", db_index=False
    )
    seq = models.IntegerField()
    state = models.CharField(max_length=8, choices=State.choices)
    # With a database default: a row the previous version inserts takes it.
    holder = models.CharField(max_length=32, blank=True, default="", db_default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        verbose_name = _("activity slot")
        verbose_name_plural = _("activity slots")
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["run", "seq"], name="weft_activity_slot_unique_seq"),
        ]
        indexes: ClassVar = [
            models.Index(fields=["activity", "key", "state", "created_at"], name="weft_activity_slot_group"),
        ]

    def __str__(self) -> str:
        return f"{self.activity} {self.key} {self.state}".strip()
