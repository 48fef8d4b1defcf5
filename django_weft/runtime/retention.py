"""Retention: delete terminal runs past their period (``WEFT_RETENTION``, per status, and
``@workflow(retention=...)``), in batches. ``manage.py weft_gc``, the Celery task
``django_weft.gc`` and the sweep (once a minute) all call :func:`purge_expired`."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..conf import weft_settings
from ..engine.registry import registry
from ..engine.retention import RETAINED_STATUSES, DueRange, due_ranges
from ..engine.run_logging import get_logger
from ..store import RetentionScan
from .process import get_store

logger = get_logger("django_weft.retention")


def _counts(counts: Counter[str], order: tuple[str, ...] | None = None) -> str:
    keys = [key for key in order if counts[key]] if order else sorted(counts)
    return ", ".join(f"{counts[key]} {key}" for key in keys)


@dataclass
class GcBatch:
    """One batch (one transaction): the runs deleted by status, the due runs kept by
    reason (:class:`~django_weft.engine.retention.KeptReason`), and how long it took."""

    purged: Counter[str]
    kept: Counter[str]
    seconds: float
    dry_run: bool = False

    def line(self) -> str:
        """``purged 80 completed, 12 failed; kept 3 (2 live child, 1 live parent)``."""
        verb = "would purge" if self.dry_run else "purged"
        purged = _counts(self.purged, RETAINED_STATUSES) or "0"
        kept = f"kept {self.kept.total()}" + (f" ({_counts(self.kept)})" if self.kept else "")
        return f"{verb} {purged}; {kept}"


@dataclass
class GcReport:
    """What :func:`purge_expired` did, batch by batch."""

    dry_run: bool = False
    batches: list[GcBatch] = field(default_factory=list)
    bulk_jobs: int = 0
    """Finished bulk jobs deleted (in a dry run: that would be), kept as long as the
    longest period of ``WEFT_RETENTION``."""

    @property
    def purged(self) -> Counter[str]:
        """Runs deleted (or, in a dry run, that would be) by status."""
        return sum((batch.purged for batch in self.batches), Counter())

    @property
    def kept(self) -> Counter[str]:
        """Due runs kept, by reason."""
        return sum((batch.kept for batch in self.batches), Counter())

    @property
    def purged_total(self) -> int:
        return self.purged.total()

    @property
    def seconds(self) -> float:
        return sum(batch.seconds for batch in self.batches)

    @property
    def longest_batch(self) -> float:
        return max((batch.seconds for batch in self.batches), default=0.0)

    def summary(self) -> str:
        """``total: purged 10000 (9000 completed, 1000 failed); kept 3 (...) in 100 batches, 2.1 s``."""
        verb = "would purge" if self.dry_run else "purged"
        purged = _counts(self.purged, RETAINED_STATUSES)
        kept = self.kept
        return (
            f"total: {verb} {self.purged_total}" + (f" ({purged})" if purged else "")
            + f"; kept {kept.total()}" + (f" ({_counts(kept)})" if kept else "")
            + f" in {len(self.batches)} batches, {self.seconds:.2f} s"
            + (f"; {verb} {self.bulk_jobs} finished bulk jobs" if self.bulk_jobs else "")
        )  # fmt: skip


def retention_ranges(now: datetime) -> list[DueRange]:
    """The ranges of runs due at ``now`` under ``WEFT_RETENTION`` and the retention of the
    workflows this process has registered."""
    overrides = {name: wf.retention for name, wf in registry.workflows.items() if wf.retention}
    return due_ranges(weft_settings.RETENTION, overrides, now)


def purge_expired(
    *,
    batch: int | None = None,
    limit: int | None = None,
    max_batches: int | None = None,
    dry_run: bool = False,
    now: datetime | None = None,
    on_batch: Callable[[GcBatch], None] | None = None,
) -> GcReport:
    """Delete the terminal runs past their retention, with their steps, timers, signals
    and updates, ``batch`` runs per transaction (default ``WEFT_TICK_BATCH``), until none
    is due, ``limit`` runs were deleted or ``max_batches`` batches were read. ``now``
    (default: the database clock) is the moment the periods are counted back from;
    ``on_batch`` is called after each batch.

    Never deleted: a live run (only terminal ones are read), a run whose parent or one of
    whose children is live, a run whose finalizer has yet to run. Those are counted as
    kept. A dry run reads the same batches, locks and deletes nothing, and reports the
    same counts (bar concurrent changes).

    Finished bulk jobs (``POST runs/bulk/``) are deleted once they are older than the
    longest period of ``WEFT_RETENTION`` (never, if a status is kept forever).

    Safe to run from several processes at once: each batch locks its runs with
    ``SKIP LOCKED``. A workflow's own retention is known to processes that import it
    (workflows modules are autodiscovered); elsewhere its runs follow the setting."""
    size = batch if batch is not None else weft_settings.TICK_BATCH
    if size < 1 or (limit is not None and limit < 0):
        raise ValueError(f"batch must be at least 1 and limit not negative; got {batch=}, {limit=}")
    store = get_store()
    now = now or store.db_now()
    scans = [RetentionScan(due) for due in retention_ranges(now)]
    report = GcReport(dry_run=dry_run)
    while not all(scan.done for scan in scans):
        if max_batches is not None and len(report.batches) >= max_batches:
            break
        room = size if limit is None else min(size, limit - report.purged_total)
        if room <= 0:
            break
        started = time.perf_counter()
        result = store.retention.purge_due_batch(scans, room, dry_run=dry_run)
        if not result.seen:
            break
        done = GcBatch(result.purged, result.kept, time.perf_counter() - started, dry_run=dry_run)
        report.batches.append(done)
        logger.info("retention: %s", done.line())
        if on_batch is not None:
            on_batch(done)
    periods = [period for period in weft_settings.RETENTION.values() if period is not None]
    if len(periods) == len(weft_settings.RETENTION):  # a status kept forever keeps the jobs too
        cutoff = now - timedelta(seconds=max(periods, default=0.0))
        report.bulk_jobs = store.retention.purge_finished_bulk_jobs(cutoff, dry_run=dry_run)
    return report
