"""Admin server time at two table sizes: the run changelist and a run's detail page.

For each size (default 10,000 and 100,000 runs) the ``weft_admin_bench`` database is
grown by one ``INSERT ... SELECT`` (:func:`fill`: mixed statuses, workflows, ages,
failures, parked runs with ``waiting_on``, children and search attributes; ``VACUUM
ANALYZE`` after), plus one run with a 1,000-step history, a parent and five children.
Each page of :func:`pages` (the changelist's first page, filters, searches, a deep page,
and the detail page with its second page of steps) is then requested ``--requests``
times through Django's test client as a superuser (the whole admin view: session,
permissions, filters, queries, templates; no network). Server time is the wall time of
one request; the summary line gives p50 and p99 per page at both sizes side by side.
``--explain`` prints each page's queries with ``EXPLAIN (ANALYZE, BUFFERS)`` first.

Targets (issue 13): changelist p50 < 150 ms at 1M runs, detail < 200 ms, flat across
sizes. ``--sizes 10000 1000000`` measures the 1M case (the fill takes a few minutes).

Usage::

    .venv/bin/python benchmarks/admin.py [--sizes 10000 100000] [--requests 100] [--explain] [--keep]

Connection settings come from PGHOST, PGPORT, PGUSER and PGPASSWORD (default
127.0.0.1:5432, user postgres). ``weft_admin_bench`` is dropped and recreated at every
invocation, unless ``--keep`` reuses the last one (the fill only adds rows).
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

from benchmarks import api as api_bench  # noqa: E402 - after the path is set
from benchmarks import common  # noqa: E402

DB = "weft_admin_bench"
HISTORY = 1000


def setup_django(keep: bool = False) -> None:
    common.setup_django(DB, urlconf="benchmarks.admin_urls", admin=True, keep=keep)
    from django_weft import WorkflowContext, workflow

    for name in api_bench.WORKFLOWS:  # the workflow filter lists registered names
        workflow(name=name)(_body)
    _ = WorkflowContext


def _body(ctx: Any, *args: Any) -> None:
    return None


# One status per run from a bucket of 1,000 (a hash of the run's number): mostly
# completed, a few percent running or parked, about 1% failed, and rarer ones (timed out,
# suspended, continued) at 0.5%.
STATUS_BUCKETS = (
    (885, "completed"),
    (905, "running"),
    (955, "waiting"),
    (965, "failed"),
    (975, "cancelled"),
    (980, "timed_out"),
    (990, "pending"),
    (995, "suspended"),
    (1000, "continued"),
)
TERMINAL = ("completed", "failed", "cancelled", "timed_out", "continued")


def fill(total: int) -> None:
    """Grow the run table to ``total`` rows by one ``INSERT ... SELECT`` (a no-op for rows
    already there), then ``VACUUM ANALYZE`` and a checkpoint.

    Runs spread over 30 days, newest last, over four workflows; statuses from
    :data:`STATUS_BUCKETS`; failed, cancelled and timed-out runs carry an error and a
    failure category (1 failure in 50 a non-determinism error, the rarest value of the
    failure filter); parked runs a ``waiting_on`` of each shape (signal, timer, condition,
    queued activity: those with the step they wait on); one run in five search attributes
    with a customer number of its own and a tier (gold for one in four); one run in fifty
    is a child of the run before it. Ids are ``md5('bench-N')`` so that children can name
    their parent in the same statement."""
    from django.db import connection

    from django_weft.models import Step, WorkflowRun

    have = WorkflowRun.objects.count()
    missing = total - have
    if missing <= 0:
        return
    table = WorkflowRun._meta.db_table
    workflows = "ARRAY[" + ",".join(f"'{name}'" for name in api_bench.WORKFLOWS) + "]"
    status = "CASE " + " ".join(f"WHEN b < {upper} THEN '{name}'" for upper, name in STATUS_BUCKETS) + " END"
    terminal = "(" + ",".join(f"'{name}'" for name in TERMINAL) + ")"
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {table} (id, workflow_id, workflow_name, workflow_version, status, args, kwargs,
                result, error, failure_category, parent_id, parent_seq, parent_close_policy,
                search_attributes, finalizer_state, finalizer, attempt, execution_deadline, waiting_on,
                ready_at, dispatched_at, owner_id, owner_epoch, lease_expires_at, claimed_at,
                created_at, updated_at, finished_at)
            SELECT md5('bench-' || k)::uuid, 'bench-' || k, ({workflows})[1 + k %% 4], '', s,
                jsonb_build_array(k), '{{}}'::jsonb,
                CASE WHEN s = 'completed' THEN jsonb_build_object('total', k %% 977) END,
                CASE WHEN s IN ('failed', 'cancelled', 'timed_out')
                     THEN jsonb_build_object('type', 'bench.Error', 'message', 'run ' || k || ' ' || s) END,
                CASE s WHEN 'failed' THEN
                          CASE WHEN c = 0 THEN 'nondeterminism' WHEN c < 5 THEN 'system'
                               WHEN c < 25 THEN 'activity' ELSE 'application' END
                       WHEN 'cancelled' THEN 'cancellation' WHEN 'timed_out' THEN 'timeout' ELSE '' END,
                CASE WHEN k %% 50 = 7 AND n > 1 THEN md5('bench-' || (k - 1))::uuid END,
                CASE WHEN k %% 50 = 7 AND n > 1 THEN 3 END,
                CASE WHEN k %% 50 = 7 AND n > 1 THEN 'terminate' ELSE '' END,
                CASE WHEN k %% 5 = 0 THEN jsonb_build_object(
                         'customer', k, 'tier', CASE WHEN k %% 20 = 0 THEN 'gold' ELSE 'silver' END)
                     ELSE '{{}}'::jsonb END,
                NULL, NULL, 1 + (k %% 13 = 0)::int, NULL,
                CASE WHEN s <> 'waiting' THEN NULL
                     WHEN k %% 4 = 0 THEN jsonb_build_object('kind', 'signal', 'seq', 2,
                         'name', 'approve', 'signals', jsonb_build_array('approve'))
                     WHEN k %% 4 = 1 THEN jsonb_build_object(
                         'kind', 'sleep', 'seq', 2, 'fire_at', to_jsonb(now() + interval '1 day'))
                     WHEN k %% 4 = 2 THEN jsonb_build_object(
                         'kind', 'condition', 'seq', 2, 'updates', jsonb_build_array('bump'))
                     ELSE jsonb_build_object(
                         'kind', 'activities', 'mode', 'all', 'seqs', jsonb_build_array(0))
                END,
                NULL, NULL, NULL, CASE WHEN s = 'pending' THEN 0 ELSE 1 END, NULL, NULL,
                at, at + interval '2 seconds',
                CASE WHEN s IN {terminal} THEN at + (k %% 600) * interval '1 second' END
            FROM (
                SELECT n, k, {status} AS s, abs(hashint4(-k)) %% 50 AS c,
                    now() - interval '30 days' + k * interval '1 second' * (2592000.0 / %s) AS at
                FROM (SELECT n, n + %s AS k, abs(hashint4(n + %s)) %% 1000 AS b
                      FROM generate_series(1, %s) AS n) AS numbered
            ) AS runs
            """,
            [total, have, have, missing],
        )
        # The queued activity each parked "activities" run waits on (its step at seq 0).
        cursor.execute(
            f"""
            INSERT INTO {Step._meta.db_table} (run_id, seq, kind, name, status, args, result, error,
                attempt, started_at, finished_at, created_at, updated_at)
            SELECT id, 0, 'activity', 'bench.send_receipt', 'scheduled', '[]'::jsonb, NULL, NULL, 1,
                created_at, NULL, created_at, created_at
            FROM {table}
            WHERE status = 'waiting' AND waiting_on->>'kind' = 'activities'
            ON CONFLICT DO NOTHING
            """
        )
        inserted = time.perf_counter() - started
        # Settle before measuring: statistics, the visibility map and dirty pages, so
        # that neither autovacuum nor a checkpoint lands in the middle of the timing.
        cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute(f"VACUUM ANALYZE {Step._meta.db_table}")
        cursor.execute("CHECKPOINT")
    print(
        f"filled {total:,} runs: {missing:,} inserted in {inserted:.0f} s, "
        f"{time.perf_counter() - started:.0f} s with VACUUM ANALYZE",
        file=sys.stderr,
    )


def long_history_run() -> str:
    """A run with a 1,000-step history, a parent and five children (made once; it stays
    the newest run's neighbour)."""
    from django.db import connection

    from django_weft.models import Step, WorkflowRun

    run = WorkflowRun.objects.filter(workflow_id="bench-long-history").first()
    if run is not None:
        return str(run.pk)
    parent = WorkflowRun.objects.filter(workflow_id="bench-1").first()
    run = WorkflowRun.objects.create(
        workflow_id="bench-long-history", workflow_name="bench.orders", parent=parent, parent_seq=0
    )
    for index in range(5):
        WorkflowRun.objects.create(
            workflow_id=f"bench-long-history-child-{index}",
            workflow_name="bench.emails",
            status="completed",
            parent=run,
            parent_seq=index * 10 + 3,
        )
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {Step._meta.db_table} (run_id, seq, kind, name, status, args, result, error,
                attempt, started_at, finished_at, created_at, updated_at)
            SELECT %s, n, CASE WHEN n %% 10 = 9 THEN 'sleep' ELSE 'activity' END, 'bench.step',
                'completed', jsonb_build_array(n), to_jsonb(n), NULL, 1 + (n %% 7 = 0)::int,
                now() - interval '1 hour' + n * interval '3 seconds',
                now() - interval '1 hour' + n * interval '3 seconds' + interval '1 second',
                now(), now()
            FROM generate_series(0, %s) AS n
            """,
            [run.pk, HISTORY - 1],
        )
    return str(run.pk)


def pages(run_id: str) -> dict[str, tuple[str, Any]]:
    """The pages measured: name -> (URL, query parameters, or a function of the request's
    number for those that vary)."""
    from datetime import timedelta

    from django.utils import timezone

    base = "/admin/django_weft/workflowrun/"
    today = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    return {
        "changelist first page": (base, {}),
        "changelist status=waiting": (base, {"status__exact": "waiting"}),
        "changelist status=failed": (base, {"status__exact": "failed"}),
        "changelist failure=nondeterm.": (base, {"failure_category__exact": "nondeterminism"}),
        "changelist workflow=": (base, {"workflow": "bench.emails"}),
        "changelist past 7 days": (
            base,
            {
                "created_at__gte": str(today - timedelta(days=7)),
                "created_at__lt": str(today + timedelta(days=1)),
            },
        ),
        "changelist has parent": (base, {"has_parent": "yes"}),
        "changelist page 20": (base, {"p": "20"}),
        "changelist search wf id": (base, lambda i: {"q": f"bench-{1 + (i * 37) % 5000}"}),
        "changelist customer=N": (base, lambda i: {"q": f"customer={5 + (i * 5) % 5000}"}),
        "changelist tier=gold": (base, {"q": "tier=gold"}),
        "detail, 1,000 steps": (f"{base}{run_id}/change/", {}),
        "detail, steps page 2": (f"{base}{run_id}/change/", {"steps_page": "2"}),
    }


def client() -> Any:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.filter(
        username="bench"
    ).first() or get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
    browser = Client()
    browser.force_login(user)
    return browser


def measure(requests: int, run_id: str) -> dict[str, tuple[float, float]]:
    browser = client()
    results = {}
    for name, (url, params) in pages(run_id).items():

        def call(i: int, url: str = url, params: Any = params) -> Any:
            return browser.get(url, params(i) if callable(params) else params)

        for i in range(5):  # warm-up: plans, caches, templates
            call(i)
        samples = []
        for i in range(requests):
            started = time.perf_counter()
            response = call(i)
            samples.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (name, response.status_code)
        results[name] = (statistics.median(samples), api_bench.percentile(samples, 0.99))
    return results


def explain(run_id: str) -> None:
    """Every query of one request of each page, with ``EXPLAIN (ANALYZE, BUFFERS)`` of
    those on weft's tables, and a warning for a ``COUNT`` or a sequential scan of them."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    browser = client()
    for name, (url, params) in pages(run_id).items():
        with CaptureQueriesContext(connection) as captured:
            response = browser.get(url, params(0) if callable(params) else params)
        assert response.status_code == 200, (name, response.status_code)
        print(f"== {name}: {len(captured.captured_queries)} queries")
        for query in captured.captured_queries:
            sql = query["sql"]
            if "django_weft_" not in sql:
                print(f"   {query['time']}s {sql[:100]}")
                continue
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
                plan = [row[0] for row in cursor.fetchall()]
            text = sql.upper() + "\n".join(plan)
            warnings = [w for w in ("COUNT(", "Seq Scan") if w in text]
            flag = f"  !! {', '.join(warnings)}" if warnings else ""
            print(f"   {query['time']}s {sql[:400]}{flag}")
            print("      " + "\n      ".join(plan))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--explain", action="store_true", help="EXPLAIN ANALYZE each page's queries")
    parser.add_argument(
        "--keep", action="store_true", help="reuse the database of the last invocation (it only grows)"
    )
    options = parser.parse_args()
    setup_django(keep=options.keep)
    by_size = {}
    for size in sorted(options.sizes):
        fill(size)
        run_id = long_history_run()
        if options.explain:
            print(f"EXPLAIN at {size:,} runs")
            explain(run_id)
        by_size[size] = measure(options.requests, run_id)
    kinds = list(next(iter(by_size.values())))
    print(f"{'page':30}" + "".join(f"{f'{size:,} runs p50 / p99':>26}" for size in by_size))
    for kind in kinds:
        print(
            f"{kind:30}"
            + "".join(f"{by_size[s][kind][0]:>13.1f} / {by_size[s][kind][1]:6.1f} ms" for s in by_size)
        )
    summary = "; ".join(
        f"{kind}: " + " vs ".join(f"{by_size[s][kind][0]:.1f}/{by_size[s][kind][1]:.1f}" for s in by_size)
        for kind in kinds
    )
    print(f"admin.py: p50/p99 ms at {' vs '.join(f'{s:,}' for s in by_size)} runs: {summary}")


if __name__ == "__main__":
    main()
