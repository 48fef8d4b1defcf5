"""Schedules: how fast a burst of due schedules starts its runs, and what a tick costs
when nothing is due, at two table sizes.

1. **Idle tick.** The ``weft_sched_bench`` database holds ``--sizes`` schedules (default
   1,000 and 100,000, bulk-inserted, none due); ``runtime.fire_due_schedules`` (the
   schedules' part of every tick) is timed ``--ticks`` times at each size. Target: p50
   < 5 ms, flat from 1k to 100k.
2. **Burst.** 10,000 schedules come due in the same second beside 100,000 that are not;
   one tick's ``fire_due_schedules`` is timed until every due one has started its run.
   The baseline is ``POST runs/`` with a workflow id (the REST start through Django's
   test client, session-authenticated: view, validation, the idempotency lookup, the
   insert), one request after another for the same number of runs in the same process.
   Target: ratio >= 1, the issue's "the start throughput of ``POST runs/``".

Usage::

    .venv/bin/python benchmarks/schedules.py [--sizes 1000 100000] [--due 10000] [--ticks 200]

Connection settings come from PGHOST, PGPORT, PGUSER and PGPASSWORD (default
127.0.0.1:5432, user postgres). ``weft_sched_bench`` is dropped and recreated at every
invocation.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import common  # noqa: E402

DB = "weft_sched_bench"
WORKFLOW = "bench.scheduled"


def setup_django() -> None:
    common.setup_django(DB, urlconf="benchmarks.api_urls")

    from django_weft import WorkflowContext, workflow

    @workflow(name=WORKFLOW)
    def scheduled(ctx: WorkflowContext, n: int) -> int:
        return n


def grow(total: int, prefix: str, *, due: bool) -> None:
    """Bulk-insert schedules up to ``total`` with this id prefix (hourly, spread over the
    hour; due ones fire a second ago)."""
    from django_weft.models import Schedule
    from django_weft.runtime import get_store

    now = get_store().db_now()
    have = Schedule.objects.filter(pk__startswith=prefix).count()
    rows = []
    for n in range(have, total):
        next_fire = now - timedelta(seconds=1) if due else now + timedelta(hours=1, seconds=n % 3600)
        rows.append(Schedule(id=f"{prefix}{n:07d}", workflow_name=WORKFLOW, args=[n], every_seconds=3600.0,
                             next_fire_at=next_fire, catchup_window_seconds=3600.0))  # fmt: skip
        if len(rows) == 5000:
            Schedule.objects.bulk_create(rows)
            rows = []
    if rows:
        Schedule.objects.bulk_create(rows)
    vacuum()


def vacuum() -> None:
    from django.db import connection

    from django_weft.models import Schedule, WorkflowRun

    with connection.cursor() as cursor:
        for model in (Schedule, WorkflowRun):
            cursor.execute(f"VACUUM ANALYZE {model._meta.db_table}")


def idle_ticks(count: int) -> list[float]:
    from django_weft.runtime import fire_due_schedules

    timings = []
    for _ in range(count):
        started = time.perf_counter()
        handled = fire_due_schedules(100)
        timings.append((time.perf_counter() - started) * 1000)
        assert handled == 0
    return timings


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(len(ordered) * share), len(ordered) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs=2, default=[1000, 100_000])
    parser.add_argument("--due", type=int, default=10_000)
    parser.add_argument("--ticks", type=int, default=200)
    options = parser.parse_args()
    setup_django()
    from django_weft import runtime
    from django_weft.models import WorkflowRun

    idle: dict[int, list[float]] = {}
    for size in sorted(options.sizes):
        grow(size, "idle-", due=False)
        idle_ticks(10)  # warm-up
        idle[size] = idle_ticks(options.ticks)
        print(f"idle tick at {size:>7} schedules: p50 {statistics.median(idle[size]):.2f} ms, "
              f"p99 {percentile(idle[size], 0.99):.2f} ms", flush=True)  # fmt: skip

    # The baseline: the same number of REST starts by workflow id.
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.create_superuser("bench", "bench@example.com", "bench"))
    started = time.perf_counter()
    for n in range(options.due):
        response = client.post(
            "/api/weft/runs/",
            {"workflow": WORKFLOW, "args": [n], "id": f"baseline-{n}"},
            content_type="application/json",
        )
        assert response.status_code == 201, response.content
    baseline = options.due / (time.perf_counter() - started)
    WorkflowRun.objects.all().delete()
    vacuum()

    grow(options.due, "due-", due=True)
    started = time.perf_counter()
    handled = runtime.fire_due_schedules(100)
    elapsed = time.perf_counter() - started
    fired = WorkflowRun.objects.filter(workflow_id__startswith="due-").count()
    assert handled == options.due and fired == options.due, (handled, fired)
    rate = options.due / elapsed
    small, large = sorted(options.sizes)
    print(
        f"schedules: {options.due} due beside {large} idle fired in {elapsed:.1f} s = {rate:.0f} runs/s, "
        f"{rate / baseline:.2f}x POST runs/ ({baseline:.0f} starts/s); idle tick p50 "
        f"{statistics.median(idle[small]):.2f} ms at {small} vs {statistics.median(idle[large]):.2f} ms "
        f"at {large} (p99 {percentile(idle[small], 0.99):.2f} vs {percentile(idle[large], 0.99):.2f} ms)"
    )
    common.drop_database(DB)


if __name__ == "__main__":
    main()
