"""Retention: deleting the due runs among a million terminal ones, and what a gc call
costs when nothing is due, at two table sizes.

1. **Nothing due.** ``weft_gc_bench`` is filled with ``--sizes`` terminal runs (default
   100,000 and 1,000,000; by one ``INSERT ... SELECT``, four workflows, mostly completed,
   some failed and cancelled, last changed over the past 29 days, ``--steps`` steps each)
   and ``runtime.purge_expired()`` (the default ``WEFT_RETENTION``, 30 days) is timed
   ``--calls`` times at each size. Target: p50 < 10 ms, flat from 100k to 1M.
2. **Due.** Each of ``--rounds`` rounds adds ``--due`` runs last changed 31 to 60 days
   ago (with their steps), 50 due parents of live children and 100 live runs beside the
   million, and times ``purge_expired(batch=--batch)`` until they are gone: the total,
   the longest batch, the batches. Meanwhile another connection keeps locking the live
   runs with ``NOWAIT`` (a refusal would mean gc holds a live run's lock) and the kept
   parents with a wait (as a child's completion does): its longest wait is compared with
   the longest batch. Figures are medians over the rounds.

Usage::

    .venv/bin/python benchmarks/gc.py [--sizes 100000 1000000] [--due 10000] [--batch 100]
        [--steps 3] [--calls 200] [--rounds 3] [--explain]

Connection settings come from PGHOST, PGPORT, PGUSER and PGPASSWORD (default
127.0.0.1:5432, user postgres). ``weft_gc_bench`` is dropped and recreated at every
invocation, and dropped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import common  # noqa: E402

DB = "weft_gc_bench"
WORKFLOWS = ["bench.orders", "bench.invoices", "bench.emails", "bench.reports"]
STATUSES = ["completed"] * 8 + ["failed", "cancelled"]
KEPT_PARENTS = 50
LIVE_RUNS = 100


def setup_django() -> None:
    common.setup_django(DB, urlconf="benchmarks.api_urls")


def _table(model: str) -> str:
    from django.apps import apps

    return str(apps.get_model("django_weft", model)._meta.db_table)


def insert_runs(
    count: int, *, tag: str, steps: int, age: tuple[float, float], status: str | None = None
) -> None:
    """Insert ``count`` runs last changed between ``age`` days ago (oldest first), with
    ``steps`` completed steps each, in one statement."""
    from django.db import connection

    workflows = "ARRAY[" + ",".join(f"'{name}'" for name in WORKFLOWS) + "]"
    statuses = "ARRAY[" + ",".join(f"'{s}'" for s in STATUSES) + "]"
    status_sql = f"'{status}'" if status else f"({statuses})[1 + (n * 7) %% 10]"
    oldest, newest = age
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH new AS (
                INSERT INTO {_table("WorkflowRun")} (id, workflow_id, workflow_name, workflow_version, status,
                    args, kwargs, result, error, failure_category, parent_id, parent_seq, parent_close_policy,
                    search_attributes, finalizer_state, finalizer, attempt, execution_deadline, waiting_on,
                    ready_at, dispatched_at, owner_id, owner_epoch, lease_expires_at, claimed_at,
                    created_at, updated_at, finished_at)
                SELECT gen_random_uuid(), %s || n, ({workflows})[1 + n %% 4], '', {status_sql},
                    jsonb_build_array(n), '{{}}'::jsonb, jsonb_build_object('total', n), NULL, '',
                    NULL, NULL, '', '{{}}'::jsonb, NULL, NULL, 1, NULL, NULL, NULL, NULL, NULL, 1, NULL, NULL,
                    moment - interval '1 minute', moment, moment
                FROM (
                    SELECT n, now() - (%s - (%s - %s) * n / %s) * interval '1 day' AS moment
                    FROM generate_series(1, %s) AS n
                ) AS spread
                RETURNING id, created_at
            )
            INSERT INTO {_table("Step")} (run_id, seq, kind, name, status, args, result, error, attempt,
                started_at, finished_at, created_at, updated_at)
            SELECT new.id, s, 'activity', 'bench.step', 'completed', jsonb_build_array(s),
                jsonb_build_object('ok', true), NULL, 1, new.created_at, new.created_at, new.created_at,
                new.created_at
            FROM new CROSS JOIN generate_series(0, %s - 1) AS s
            """,
            [f"{tag}-", float(oldest), float(oldest), float(newest), count, count, steps],
        )


def settle() -> None:
    """Statistics, the visibility map and dirty pages, so that neither autovacuum nor a
    checkpoint lands in the middle of the timing."""
    from django.db import connection

    with connection.cursor() as cursor:
        for model in ("WorkflowRun", "Step"):
            cursor.execute(f"VACUUM ANALYZE {_table(model)}")
        cursor.execute("CHECKPOINT")


def fill(total: int, steps: int) -> None:
    from django_weft.models import WorkflowRun

    have = WorkflowRun.objects.count()
    chunk = 100_000
    while have < total:
        count = min(chunk, total - have)
        insert_runs(count, tag=f"bench-{have}", steps=steps, age=(29, 0.01))
        have += count
    settle()


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def idle_calls(count: int) -> list[float]:
    from django_weft.runtime import purge_expired

    timings = []
    for _ in range(count):
        started = time.perf_counter()
        report = purge_expired()
        timings.append((time.perf_counter() - started) * 1000)
        assert not report.batches, report.summary()
    return timings


def add_kept_and_live(round_tag: str) -> tuple[list[Any], list[Any]]:
    """50 due parents, each with a live (waiting) child, and 100 live runs."""
    from datetime import timedelta

    from django_weft.models import WorkflowRun
    from django_weft.runtime import get_store

    old = get_store().db_now() - timedelta(days=45)
    parents = WorkflowRun.objects.bulk_create(
        WorkflowRun(workflow_id=f"{round_tag}-parent-{n}", workflow_name=WORKFLOWS[0], status="completed")
        for n in range(KEPT_PARENTS)
    )
    children = WorkflowRun.objects.bulk_create(
        WorkflowRun(
            workflow_id=f"{round_tag}-child-{n}", workflow_name=WORKFLOWS[1], status="waiting", parent=p
        )
        for n, p in enumerate(parents)
    )
    live = WorkflowRun.objects.bulk_create(
        WorkflowRun(workflow_id=f"{round_tag}-live-{n}", workflow_name=WORKFLOWS[2], status="running")
        for n in range(LIVE_RUNS)
    )
    WorkflowRun.objects.filter(pk__in=[p.pk for p in parents]).update(updated_at=old)
    WorkflowRun.objects.filter(pk__in=[r.pk for r in [*children, *live]]).update(updated_at=old)
    return [p.pk for p in parents], [r.pk for r in [*children, *live]]


class Probe(threading.Thread):
    """Locks live runs with NOWAIT (counting refusals) and kept parents with a wait
    (recording the longest), in a loop, on a connection of its own."""

    def __init__(self, live: list[Any], parents: list[Any]) -> None:
        super().__init__(name="probe")
        self.live, self.parents = live, parents
        self.stop = threading.Event()
        self.refused = 0
        self.probes = 0
        self.waits: list[float] = []

    def run(self) -> None:
        from django.db import OperationalError, connection, transaction

        from django_weft.models import WorkflowRun

        try:
            n = 0
            while not self.stop.is_set():
                try:
                    with transaction.atomic():
                        list(
                            WorkflowRun.objects.select_for_update(nowait=True)
                            .filter(pk__in=self.live)
                            .values("pk")
                        )
                except OperationalError:
                    self.refused += 1
                self.probes += 1
                parent = self.parents[n % len(self.parents)]
                n += 1
                started = time.perf_counter()
                with transaction.atomic():
                    list(WorkflowRun.objects.select_for_update().filter(pk=parent).values("pk"))
                self.waits.append(time.perf_counter() - started)
        finally:
            connection.close()


def due_round(size: int, options: argparse.Namespace, number: int) -> dict[str, float]:
    from django_weft.models import Step, WorkflowRun
    from django_weft.runtime import purge_expired

    tag = f"due{number}"
    insert_runs(options.due, tag=tag, steps=options.steps, age=(60, 31))
    parents, live = add_kept_and_live(tag)
    settle()
    steps_before = Step.objects.count()
    probe = Probe(live, parents)
    probe.start()
    try:
        report = purge_expired(batch=options.batch)
    finally:
        probe.stop.set()
        probe.join()
    assert report.purged_total == options.due, report.summary()
    # A parent the probe holds at that moment is skipped (SKIP LOCKED), not counted.
    assert set(report.kept) == {"live child"} and report.kept.total() <= KEPT_PARENTS, report.summary()
    assert Step.objects.count() == steps_before - options.due * options.steps
    # Let the children finish and leave: the table stays at about ``size`` runs.
    WorkflowRun.objects.filter(pk__in=live).delete()
    WorkflowRun.objects.filter(pk__in=parents).delete()
    assert WorkflowRun.objects.count() == size, WorkflowRun.objects.count()
    figures = {
        "seconds": report.seconds,
        "longest_ms": report.longest_batch * 1000,
        "batches": len(report.batches),
        "refused": probe.refused,
        "probes": probe.probes,
        "max_wait_ms": max(probe.waits, default=0.0) * 1000,
    }
    print(f"  round {number}: {options.due} due deleted in {figures['seconds']:.2f} s, "
          f"{figures['batches']} batches, longest {figures['longest_ms']:.1f} ms; live runs locked "
          f"{probe.refused} times in {probe.probes} probes; longest wait for a kept parent "
          f"{figures['max_wait_ms']:.1f} ms", flush=True)  # fmt: skip
    return figures


def explain(options: argparse.Namespace) -> None:
    """``EXPLAIN ANALYZE`` of a batch's page query (the completed range) with ``--due``
    runs due."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from django_weft.runtime import get_store
    from django_weft.runtime.retention import retention_ranges
    from django_weft.store import RetentionScan

    store = get_store()
    scan = RetentionScan(retention_ranges(store.db_now())[0])
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        store.retention._due_page(scan, options.batch, lock=False)
    with connection.cursor() as cursor:
        (page,) = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + page)
        print("\n".join("    " + row[0] for row in cursor.fetchall()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs=2, default=[100_000, 1_000_000])
    parser.add_argument("--due", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--explain", action="store_true")
    options = parser.parse_args()
    setup_django()
    small, large = sorted(options.sizes)
    try:
        idle: dict[int, list[float]] = {}
        for size in (small, large):
            started = time.perf_counter()
            fill(size, options.steps)
            print(f"filled {size} runs ({options.steps} steps each) in {time.perf_counter() - started:.0f} s",
                  flush=True)  # fmt: skip
            idle_calls(10)  # warm-up
            idle[size] = idle_calls(options.calls)
            print(f"nothing due at {size:>8} runs: p50 {statistics.median(idle[size]):.2f} ms, "
                  f"p99 {percentile(idle[size], 0.99):.2f} ms", flush=True)  # fmt: skip
        if options.explain:
            insert_runs(options.due, tag="explain", steps=options.steps, age=(60, 31))
            settle()
            explain(options)
            from django_weft.runtime import purge_expired

            purge_expired(batch=1000)
        rounds = [due_round(large, options, n) for n in range(1, options.rounds + 1)]
        med = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
        idle_small, idle_large = statistics.median(idle[small]), statistics.median(idle[large])
        print(
            f"gc: {options.due} due of {large} terminal runs deleted in {med['seconds']:.2f} s "
            f"({options.due / med['seconds']:.0f} runs/s, {med['batches']:.0f} batches of {options.batch}, "
            f"longest {med['longest_ms']:.1f} ms; live runs locked {sum(r['refused'] for r in rounds):.0f} "
            f"times, longest wait for a kept parent {med['max_wait_ms']:.1f} ms) | nothing due: p50 "
            f"{idle_small:.2f} ms at {small} vs {idle_large:.2f} ms at {large} "
            f"({idle_large / 10:.2f}x the 10 ms target; {idle_large / idle_small:.2f}x from {small} "
            f"to {large}) "
            f"| medians of {options.rounds} rounds"
        )
    finally:
        common.drop_database(DB)


if __name__ == "__main__":
    main()
