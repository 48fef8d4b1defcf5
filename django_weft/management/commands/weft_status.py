"""``manage.py weft_status``: counts per status, the oldest waiting run, expired leases,
the live workers, the runs no live worker can execute, the due schedules no live worker
can fire, the busiest concurrency keys, the rate limits that are behind and the busiest
activity concurrency groups."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from ... import runtime


class Command(BaseCommand):
    help = (
        "Print run counts per status, the oldest waiting and runnable runs, expired leases, due "
        "timers, the live workers (what each has registered), the active runs and the due "
        "schedules of workflows that no live worker has registered, the busiest concurrency "
        "keys (slots in use of the limit, runs queued, the longest a queued run has waited), "
        "the rate limit buckets whose next free moment is ahead (the rate, how far ahead) and "
        "the busiest activity concurrency groups (slots held of the limit, attempts waiting)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        report = runtime.status_report()
        now = timezone.now()
        width = max(len(status) for status in report.counts)
        self.stdout.write("runs by status:")
        for status, count in report.counts.items():
            self.stdout.write(f"  {status:<{width}}  {count}")
        for label, run in (
            ("oldest waiting", report.oldest_waiting),
            ("oldest runnable", report.oldest_runnable),
        ):
            if run is None:
                self.stdout.write(f"{label}: none")
            else:
                since = run.updated_at if label == "oldest waiting" else (run.ready_at or run.created_at)
                age = (now - since).total_seconds()
                self.stdout.write(
                    f"{label}: {run.workflow} {run.workflow_id} (run {run.run_id}), for {age:.1f}s"
                    + (f", waiting on {run.waiting_on.get('kind')}" if run.waiting_on else "")
                )
        self.stdout.write(f"expired leases: {report.expired_leases}")
        oldest = report.oldest_due_timer
        overdue = f" (oldest {((now - oldest).total_seconds()):.1f}s overdue)" if oldest else ""
        self.stdout.write(f"due timers not yet fired: {report.due_timers}{overdue}")
        self._write_workers(runtime.worker_coverage(report))
        self._write_keys(runtime.busiest_keys())
        self._write_rate_limits(runtime.busy_rate_limits())
        self._write_activity_groups(runtime.busiest_activity_groups())

    def _write_workers(self, coverage: runtime.WorkerCoverage) -> None:
        self.stdout.write(f"live workers: {len(coverage.live)}")
        for worker in coverage.live:
            beat = (coverage.read_at - worker.heartbeat_at).total_seconds()
            queues = ", ".join(worker.activity_queues) or "none"
            self.stdout.write(
                f"  {worker.engine_id} ({worker.kind}), heartbeat {max(beat, 0):.1f}s ago: "
                f"{len(worker.workflows)} workflows, activity queues: {queues}"
            )
        if not coverage.stranded:
            self.stdout.write("runs no live worker can execute: none")
        else:
            self.stdout.write(f"runs no live worker can execute: {coverage.stranded_runs}")
            for workflow in coverage.stranded:
                by_status = ", ".join(f"{count} {status}" for status, count in workflow.counts.items())
                self.stdout.write(f"  {workflow.name}: {workflow.total} ({by_status})")
        if not coverage.stranded_schedules:
            self.stdout.write("due schedules no live worker can fire: none")
            return
        self.stdout.write(f"due schedules no live worker can fire: {coverage.stranded_schedule_count}")
        for group in coverage.stranded_schedules:
            age = max((coverage.read_at - group.oldest_due_at).total_seconds(), 0.0)
            self.stdout.write(f"  {group.name}: {group.due} (the oldest due {age:.1f}s ago)")

    def _write_keys(self, busiest: runtime.BusiestKeys) -> None:
        if not busiest.keys:
            self.stdout.write("concurrency keys: no run holds or waits for a slot")
            return
        self.stdout.write(f"busiest concurrency keys (at most {runtime.BUSIEST_SHOWN}):")
        rows = [("workflow", "key", "in use", "queued", "queued longest")]
        for group in busiest.keys:
            limit = str(group.limit) if group.limit is not None else "?"
            oldest = group.oldest_queued_at
            waited = f"{max((busiest.read_at - oldest).total_seconds(), 0):.1f}s" if oldest else "-"
            rows.append(
                (group.workflow, group.key or "(whole workflow)", f"{group.in_use}/{limit}",
                 str(group.queued), waited)
            )  # fmt: skip
        self._write_table(rows, right=(2, 3))

    def _write_rate_limits(self, busy: runtime.BusyBuckets) -> None:
        if not busy.buckets:
            self.stdout.write("rate limits: none behind")
            return
        self.stdout.write(f"rate limits behind (at most {runtime.BUSIEST_SHOWN}):")
        rows = [("rate limit", "key", "rate", "next free in", "attempts")]
        for bucket in busy.buckets:
            rate = str(bucket.rate) if bucket.rate is not None else "?"
            attempts = bucket.backlog_attempts
            ahead = f"{max(bucket.backlog.total_seconds(), 0):.1f}s"
            rows.append(
                (
                    bucket.name,
                    bucket.key or "(no key)",
                    rate,
                    ahead,
                    f"~{attempts}" if attempts is not None else "?",
                )
            )
        self._write_table(rows, right=(3, 4))

    def _write_activity_groups(self, busiest: runtime.BusiestActivityGroups) -> None:
        if not busiest.groups:
            self.stdout.write("activity concurrency: no attempt holds or waits for a slot")
            return
        self.stdout.write(f"busiest activity concurrency (at most {runtime.BUSIEST_SHOWN}):")
        rows = [("activity", "key", "held", "waiting", "waiting longest")]
        for group in busiest.groups:
            limit = str(group.limit) if group.limit is not None else "?"
            oldest = group.oldest_waiting_at
            waited = f"{max((busiest.read_at - oldest).total_seconds(), 0):.1f}s" if oldest else "-"
            rows.append(
                (group.activity, group.key or "(no key)", f"{group.held}/{limit}", str(group.waiting), waited)
            )
        self._write_table(rows, right=(2, 3))

    def _write_table(self, rows: Sequence[Sequence[str]], *, right: tuple[int, ...]) -> None:
        """``rows`` (the header first) in columns, those in ``right`` aligned right."""
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
        for row in rows:
            cells = [
                cell.rjust(width) if column in right else cell.ljust(width)
                for column, (cell, width) in enumerate(zip(row, widths, strict=True))
            ]
            self.stdout.write("  " + "  ".join(cells).rstrip())
