"""The worker table: what each worker process can run, written with its heartbeat, and
what no live worker can run (docs/explanation/decisions.md)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction

from ..models import Worker
from .sql import StoreSql


@dataclass(frozen=True)
class Advert:
    """What a worker process says about itself."""

    engine_id: str
    kind: str
    hostname: str
    pid: int
    workflows: tuple[str, ...]
    activity_queues: tuple[str, ...]


class WorkerRows:
    """Worker rows: one per engine, written by that engine's heartbeat only."""

    def __init__(self, sql: StoreSql) -> None:
        self.sql = sql

    def rows(self) -> Any:
        return Worker.objects.using(self.sql.alias)

    def advertise(self, advert: Advert) -> bool:
        """Record ``advert`` with the database time as its heartbeat; returns whether the
        row is new (the first advert of this engine, or one whose row was forgotten)."""
        now = self.sql.now_value()
        values = {
            "kind": advert.kind,
            "hostname": advert.hostname[:255],
            "pid": advert.pid,
            "workflows": sorted(advert.workflows),
            "activity_queues": sorted(advert.activity_queues),
            "heartbeat_at": now,
        }
        if self.rows().filter(pk=advert.engine_id).update(**values):
            return False
        try:
            with transaction.atomic(using=self.sql.alias):
                self.rows().create(engine_id=advert.engine_id, started_at=now, **values)
        except IntegrityError:  # written meanwhile by this same engine's other thread
            self.rows().filter(pk=advert.engine_id).update(**values)
            return False
        return True

    def forget(self, engine_id: str) -> None:
        """Delete the row of an engine that stops."""
        self.rows().filter(pk=engine_id).delete()

    def forget_silent(self, older_than: float) -> int:
        """Delete the rows of workers whose heartbeat stopped more than ``older_than``
        seconds ago (killed processes never delete their own)."""
        cutoff = self.sql.db_now() - timedelta(seconds=older_than)
        deleted, _ = self.rows().filter(heartbeat_at__lt=cutoff).delete()
        return deleted

    def live(self, window: float, now: datetime | None = None) -> tuple[datetime, list[Worker]]:
        """The database time (or ``now``, a database time the caller read), and the workers
        whose heartbeat wrote within ``window`` seconds of it, oldest first."""
        now = now if now is not None else self.sql.db_now()
        recent = self.rows().filter(heartbeat_at__gte=now - timedelta(seconds=window))
        return now, list(recent.order_by("started_at", "engine_id"))

    def send_again_if_elsewhere(self, run_id: str, known: Collection[str], window: float) -> str | None:
        """A turn of ``run_id`` reached a worker that has only ``known`` workflows and did not
        claim it. If the run is runnable, of a workflow not in ``known`` that a live worker
        (heartbeat within ``window`` seconds) has, clear its dispatch mark so the next
        sweep sends it again at once; returns that workflow's name. A run no live worker
        can execute keeps its mark: the sweep's back-off paces its resends."""
        name = self.sql.runs().runnable().filter(pk=run_id).values_list("workflow_name", flat=True).first()
        if name is None or name in known:
            return None
        _, live = self.live(window)
        if not any(name in (worker.workflows or ()) for worker in live):
            return None
        self.sql.runs().runnable().filter(pk=run_id).update(dispatched_at=None)
        return name

    def make_runnable_again(self, workflows: Collection[str]) -> int:
        """Clear the dispatch mark of the unowned runnable runs of ``workflows``, so the next
        sweep sends them at once: runs that waited for a worker with their code while the
        sweep's resends backed off (called when a worker that has them starts)."""
        if not workflows:
            return 0
        return (
            self.sql.runs()
            .runnable()
            .filter(workflow_name__in=sorted(workflows), dispatched_at__isnull=False)
            .update(dispatched_at=None)
        )


__all__ = ["Advert", "WorkerRows"]
