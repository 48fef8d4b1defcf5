from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _


class Worker(models.Model):
    """A worker process as it last advertised itself: what it can run, and when its
    heartbeat last wrote. One row per engine (a ``weft_worker`` process, a Celery pool
    process); written only by ``store``, with each heartbeat."""

    class Kind(models.TextChoices):
        WEFT_WORKER = "weft_worker", _("weft_worker")
        CELERY = "celery", _("Celery worker")

    engine_id = models.CharField(primary_key=True, max_length=100)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    hostname = models.CharField(max_length=255, blank=True, default="")
    pid = models.PositiveIntegerField(default=0)
    # Sorted lists of names: the workflows registered in the process, and the queues of
    # queued activities it runs (a Celery worker: those among the queues it consumes).
    workflows = models.JSONField(default=list)
    activity_queues = models.JSONField(default=list)
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()

    class Meta:
        verbose_name = _("worker")
        verbose_name_plural = _("workers")
        indexes: ClassVar = [models.Index(fields=["heartbeat_at"], name="weft_worker_heartbeat")]

    def __str__(self) -> str:
        return f"{self.kind} {self.engine_id}"
