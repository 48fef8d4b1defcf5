"""``manage.py weft_status``: counts per status, the oldest waiting run, expired leases,
the live workers, and the runs no live worker can execute."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from ... import runtime


class Command(BaseCommand):
    help = (
        "Print run counts per status, the oldest waiting and runnable runs, expired leases, due "
        "timers, the live workers (what each has registered), and the active runs of workflows "
        "that no live worker has registered."
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
            return
        self.stdout.write(f"runs no live worker can execute: {coverage.stranded_runs}")
        for workflow in coverage.stranded:
            by_status = ", ".join(f"{count} {status}" for status, count in workflow.counts.items())
            self.stdout.write(f"  {workflow.name}: {workflow.total} ({by_status})")
