"""REST API server time at two table sizes: ``GET runs/`` pages and ``POST runs/``.

For each size (default 10,000 and 100,000 runs) the ``weft_api_bench`` database is
filled by bulk ``INSERT ... SELECT`` with runs of mixed statuses, workflows, ages and
search attributes, analysed, and then each request is made ``--requests`` times through
Django's test client in this process (the full view: authentication, permissions,
filters, the query, serialisation; no network). Server time is the wall time of one
request. The summary line gives p50 and p99 per request kind at both sizes side by side.

Targets (issue 12): list pages p50 < 25 ms and p99 < 60 ms, start p50 < 8 ms, flat
from 10k to 100k runs. ``--explain`` prints ``EXPLAIN`` of each list query.

Usage::

    .venv/bin/python benchmarks/api.py [--sizes 10000 100000] [--requests 200] [--explain]

Connection settings come from PGHOST, PGPORT, PGUSER and PGPASSWORD (default
127.0.0.1:5432, user postgres). ``weft_api_bench`` is dropped and recreated at every
invocation.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import common  # noqa: E402 - after the path is set

DB = "weft_api_bench"
WORKFLOWS = ["bench.orders", "bench.invoices", "bench.emails", "bench.reports"]
STATUSES = ["completed"] * 6 + ["running", "waiting", "failed", "cancelled"]


def setup_django() -> None:
    common.setup_django(DB, urlconf="benchmarks.api_urls")

    from django_weft import WorkflowContext, workflow

    @workflow(name="bench.orders")
    def orders(ctx: WorkflowContext, order_id: int) -> int:
        return order_id


def fill(total: int) -> None:
    """Grow the run table to ``total`` rows (a no-op for rows already there)."""
    from django.db import connection

    from django_weft.models import WorkflowRun

    have = WorkflowRun.objects.count()
    missing = total - have
    if missing <= 0:
        return
    table = WorkflowRun._meta.db_table
    workflows = "ARRAY[" + ",".join(f"'{name}'" for name in WORKFLOWS) + "]"
    statuses = "ARRAY[" + ",".join(f"'{status}'" for status in STATUSES) + "]"
    with connection.cursor() as cursor:
        # Runs spread over 30 days, newest last; one in five has search attributes, with a
        # customer number of its own (a search matches one run at every table size).
        cursor.execute(
            f"""
            INSERT INTO {table} (id, workflow_id, workflow_name, workflow_version, status, args, kwargs,
                result, error, failure_category, parent_id, parent_seq, parent_close_policy,
                search_attributes, finalizer_state, finalizer, attempt, execution_deadline, waiting_on,
                ready_at, dispatched_at, owner_id, owner_epoch, lease_expires_at, claimed_at,
                created_at, updated_at, finished_at)
            SELECT gen_random_uuid(), 'bench-' || (n + %s), ({workflows})[1 + n %% 4], '',
                ({statuses})[1 + (n * 7) %% 10], jsonb_build_array(n), '{{}}'::jsonb,
                NULL, NULL, '', NULL, NULL, '',
                CASE WHEN n %% 5 = 0 THEN jsonb_build_object('customer', n + %s, 'tier', 'gold')
                     ELSE '{{}}'::jsonb END,
                NULL, NULL, 1, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL,
                now() - interval '30 days' + (n + %s) * interval '1 second' * (2592000.0 / %s),
                now(), NULL
            FROM generate_series(1, %s) AS n
            """,
            [have, have, have, total, missing],
        )
        # Settle before measuring: statistics, the visibility map and dirty pages, so
        # that neither autovacuum nor a checkpoint lands in the middle of the timing.
        cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute("CHECKPOINT")


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def measure(requests: int) -> dict[str, tuple[float, float]]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.filter(
        username="bench"
    ).first() or get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(user)

    deep = client.get("/api/weft/runs/?page_size=50").json()
    for _ in range(20):  # 20 pages down: a cursor 1,000 runs deep
        deep = client.get(deep["next"]).json()
    deep_url = deep["next"]

    kinds: dict[str, Any] = {
        "list first page": lambda i: client.get("/api/weft/runs/"),
        "list status=failed": lambda i: client.get("/api/weft/runs/?status=failed"),
        "list search.customer": lambda i: client.get(f"/api/weft/runs/?search.customer={5 + (i * 5) % 5000}"),
        "list deep cursor": lambda i: client.get(deep_url),
        "start": lambda i: client.post(
            "/api/weft/runs/",
            {"workflow": "bench.orders", "args": [i]},
            content_type="application/json",
        ),
    }
    results = {}
    for name, call in kinds.items():
        for i in range(10):  # warm-up: plans, caches, connection
            call(i)
        samples = []
        for i in range(requests):
            started = time.perf_counter()
            response = call(i)
            samples.append((time.perf_counter() - started) * 1000)
            assert response.status_code in (200, 201), (name, response.status_code, response.content[:300])
        results[name] = (statistics.median(samples), percentile(samples, 0.99))
    return results


def explain() -> None:
    from django.db import connection

    from django_weft.api.filters import RunFilter
    from django_weft.models import WorkflowRun

    order = ("-created_at", "id")
    base = WorkflowRun.objects.order_by(*order)
    queries = {
        "first page": base,
        "status=failed": RunFilter({"status": ["failed"]}, queryset=base).qs,
        "search.customer=5": base.search(customer=5),
        "deep cursor": base.filter(created_at__lt=WorkflowRun.objects.order_by(*order)[1000].created_at),
    }
    for name, queryset in queries.items():
        sql, params = queryset[:51].query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql, params)
            plan = "\n    ".join(row[0] for row in cursor.fetchall())
        print(f"-- {name}:\n    {plan}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--explain", action="store_true")
    options = parser.parse_args()
    setup_django()
    by_size = {}
    for size in sorted(options.sizes):
        fill(size)
        by_size[size] = measure(options.requests)
        if options.explain:
            print(f"EXPLAIN at {size} runs")
            explain()
    kinds = list(next(iter(by_size.values())))
    header = f"{'request':24}" + "".join(f"{f'{size:,} runs p50 / p99':>26}" for size in by_size)
    print(header)
    for kind in kinds:
        print(
            f"{kind:24}"
            + "".join(f"{by_size[s][kind][0]:>13.1f} / {by_size[s][kind][1]:6.1f} ms" for s in by_size)
        )
    summary = "; ".join(
        f"{kind}: " + " vs ".join(f"{by_size[s][kind][0]:.1f}/{by_size[s][kind][1]:.1f}" for s in by_size)
        for kind in kinds
    )
    sizes = " vs ".join(f"{s:,}" for s in by_size)
    print(f"api.py: p50/p99 ms at {sizes} runs: {summary}")


if __name__ == "__main__":
    main()
