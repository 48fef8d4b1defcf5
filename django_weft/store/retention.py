"""Retention: deleting terminal runs past their period, one batch per transaction.

A batch is read from the due ranges (:class:`~django_weft.engine.retention.DueRange`) in
order, each an index range scan of the partial indexes on terminal runs
(``weft_run_terminal_updated``: status, updated_at; ``weft_run_terminal_name``:
workflow_name, status, updated_at), so a batch costs what it takes, however many runs
are kept. Its runs are locked with ``SKIP LOCKED``; the ones that must stay (a live
parent or child, a finalizer still to run) are kept, the others deleted with their
steps, timers, signals and updates.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.db.models import Q

from ..engine.finalizers import UNFINISHED_FINALIZER_STATUSES
from ..engine.records import ACTIVE_STATUSES, TERMINAL_STATUSES
from ..engine.retention import DueRange, KeptReason
from ..models import BulkJob, WorkflowRun
from .sql import StoreSql

_TERMINAL = sorted(TERMINAL_STATUSES)  # as in the partial indexes' predicate (SQLite matches it as written)
_ACTIVE = sorted(ACTIVE_STATUSES)


@dataclass
class RetentionScan:
    """How far the scan of one due range has got: the last run it read, by
    ``(updated_at, id)``. Runs kept stay behind it, so a pass reads each due run once."""

    due: DueRange
    after: tuple[datetime, uuid.UUID] | None = None
    done: bool = False


@dataclass
class PurgedBatch:
    """What one batch deleted (or, in a dry run, would delete) by status, and kept by reason."""

    purged: Counter[str] = field(default_factory=Counter)
    kept: Counter[str] = field(default_factory=Counter)

    @property
    def seen(self) -> int:
        return self.purged.total() + self.kept.total()


class Retention:
    """Deletion of terminal runs past their retention, and of finished bulk jobs."""

    def __init__(self, sql: StoreSql) -> None:
        self.sql = sql

    def purge_due_batch(
        self, scans: Sequence[RetentionScan], batch: int, *, dry_run: bool = False
    ) -> PurgedBatch:
        """Read up to ``batch`` due runs from ``scans`` (in order, advancing each past what
        it read) and delete those that may go, in one transaction. A dry run reads the
        same runs without locking them and deletes nothing. An empty result means every
        scan is done.

        Locks: the batch's runs (terminal, due) with ``SKIP LOCKED``, then, also without
        waiting, the terminal children of the ones to delete, whose parent link is
        cleared. A live run is never locked, so a turn never waits for this; a child
        finishing waits for its kept parent's row at most until the batch commits. A child
        locked by someone else (it may be being retried) keeps its parent for now: waiting
        for it while holding the parent would invert the child-then-parent order of a
        child's completion."""
        lock = not dry_run
        with transaction.atomic(using=self.sql.alias):
            rows: list[tuple[uuid.UUID, str, uuid.UUID | None]] = []
            for scan in scans:
                room = batch - len(rows)
                if room <= 0:
                    break
                if scan.done:
                    continue
                page = self._due_page(scan, room, lock=lock)
                scan.done = len(page) < room
                if page:
                    scan.after = (page[-1][1], page[-1][0])
                rows += [(pk, status, parent) for pk, _, status, parent in page]
            if not rows:
                return PurgedBatch()
            kept = self._retention_holds(rows, lock=lock)
            doomed = [pk for pk, _, _ in rows if pk not in kept]
            if doomed and not dry_run:
                self._delete_runs(doomed)
        return PurgedBatch(
            purged=Counter(status for pk, status, _ in rows if pk not in kept), kept=Counter(kept.values())
        )

    def _due_page(
        self, scan: RetentionScan, size: int, *, lock: bool
    ) -> list[tuple[uuid.UUID, datetime, str, uuid.UUID | None]]:
        """The next ``size`` runs of the scan's range after its position, oldest first:
        ``(id, updated_at, status, parent_id)``."""
        due = scan.due
        runs = self.sql.runs().filter(status__in=_TERMINAL, status=due.status, updated_at__lt=due.cutoff)
        if due.workflow is not None:
            runs = runs.filter(workflow_name=due.workflow)
        if due.excluded:
            runs = runs.exclude(workflow_name__in=due.excluded)
        if scan.after is not None:
            last, last_pk = scan.after
            # ``updated_at >= last`` bounds the index range; the rest skips the runs read.
            after = Q(updated_at__gt=last) | Q(updated_at=last, pk__gt=last_pk)
            runs = runs.filter(after, updated_at__gte=last)
        if lock:
            runs = runs.select_for_update(skip_locked=True)
        page = runs.order_by("updated_at", "pk").values_list("pk", "updated_at", "status", "parent_id")
        return list(page[:size])

    def _retention_holds(
        self, rows: list[tuple[uuid.UUID, str, uuid.UUID | None]], *, lock: bool
    ) -> dict[uuid.UUID, str]:
        """The runs among ``rows`` that must be kept, with the reason."""
        ids = [pk for pk, _, _ in rows]
        holds: dict[uuid.UUID, str] = {}
        parents = {parent for _, _, parent in rows if parent is not None}
        if parents:
            live = set(
                self.sql.runs().filter(pk__in=parents, status__in=_ACTIVE).values_list("pk", flat=True)
            )
            holds.update({pk: KeptReason.LIVE_PARENT for pk, _, parent in rows if parent in live})
        children = list(self.sql.runs().filter(parent_id__in=ids).values_list("pk", "parent_id", "status"))
        for _, parent, status in children:
            if status in ACTIVE_STATUSES:
                holds.setdefault(parent, KeptReason.LIVE_CHILD)
        unfinished = sorted(UNFINISHED_FINALIZER_STATUSES)
        finalizing = self.sql.runs().filter(pk__in=ids, finalizer__status__in=unfinished)
        for pk in finalizing.values_list("pk", flat=True):
            holds.setdefault(pk, KeptReason.FINALIZER)
        settled = [child for child, parent, _ in children if parent not in holds]
        if lock and settled:
            # Re-read under the lock: a child retried since the read above is live now.
            locked = set(
                self.sql.runs()
                .filter(pk__in=settled, status__in=_TERMINAL)
                .select_for_update(skip_locked=True)
                .values_list("pk", flat=True)
            )
            for child, parent, _ in children:
                if parent not in holds and child not in locked:
                    holds[parent] = KeptReason.LIVE_CHILD
        return holds

    def _delete_runs(self, ids: list[uuid.UUID]) -> None:
        """Delete the runs ``ids`` (locked by the caller, their children too): the ORM's
        delete clears the children's parent link, deletes the steps, timers, signals and
        updates (one statement each) and applies the ``on_delete`` of a project's own
        models that point at runs."""
        WorkflowRun.objects.using(self.sql.alias).filter(pk__in=ids).only("pk").delete()

    def purge_finished_bulk_jobs(self, finished_before: datetime, *, dry_run: bool = False) -> int:
        """Delete the finished bulk jobs (completed or failed) that finished before
        ``finished_before``; return how many (in a dry run: how many would be). Open jobs
        are never deleted. Jobs are few, so one statement does it."""
        finished = BulkJob.objects.using(self.sql.alias).filter(
            status__in=[BulkJob.Status.COMPLETED, BulkJob.Status.FAILED], finished_at__lt=finished_before
        )
        if dry_run:
            return finished.count()
        deleted, _ = finished.delete()
        return deleted
