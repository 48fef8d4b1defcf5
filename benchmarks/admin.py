"""Admin server time at two table sizes: the run changelist and a run's detail page.

For each size (default 10,000 and 100,000 runs) the ``weft_admin_bench`` database is
filled the way ``benchmarks/api.py`` fills its own (mixed statuses, workflows, ages and
search attributes; ``VACUUM ANALYZE`` after), plus one run with a 1,000-step history.
Each page is then requested ``--requests`` times through Django's test client as a
superuser (the whole admin view: session, permissions, filters, queries, templates; no
network). Server time is the wall time of one request; the summary line gives p50 and
p99 per page at both sizes side by side.

Targets (issue 13): changelist p50 < 150 ms at 1M runs, detail < 200 ms, flat across
sizes. ``--sizes 10000 1000000`` measures the 1M case (the fill takes a minute or more).

Usage::

    .venv/bin/python benchmarks/admin.py [--sizes 10000 100000] [--requests 100]

Connection settings come from PGHOST, PGPORT, PGUSER and PGPASSWORD (default
127.0.0.1:5432, user postgres). ``weft_admin_bench`` is dropped and recreated at every
invocation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import api as api_bench  # noqa: E402 - after the path is set

DB = "weft_admin_bench"
HISTORY = 1000


def setup_django() -> None:
    import django
    from django.conf import settings

    with api_bench.admin_connection() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    settings.configure(
        DEBUG=False,
        SECRET_KEY="benchmark-only",
        USE_TZ=True,
        TIME_ZONE="UTC",
        ALLOWED_HOSTS=["testserver"],
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django.contrib.staticfiles",
            "django_weft",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        STATIC_URL="static/",
        ROOT_URLCONF="benchmarks.admin_urls",
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": DB,
                "USER": os.environ.get("PGUSER", "postgres"),
                "PASSWORD": os.environ.get("PGPASSWORD", ""),
                "HOST": os.environ.get("PGHOST", "127.0.0.1"),
                "PORT": os.environ.get("PGPORT", "5432"),
                "CONN_MAX_AGE": None,
            }
        },
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        WEFT_AUTODISCOVER_MODULE=None,
        WEFT_DISPATCHER="django_weft.dispatch.SweepOnlyDispatcher",
        LOGGING_CONFIG=None,
    )
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    from django_weft import WorkflowContext, workflow

    for name in api_bench.WORKFLOWS:  # the workflow filter lists registered names
        workflow(name=name)(_body)
    _ = WorkflowContext


def _body(ctx: Any, *args: Any) -> None:
    return None


def long_history_run() -> str:
    """A run with a 1,000-step history (made once; it stays the newest run's neighbour)."""
    from django.db import connection

    from django_weft.models import Step, WorkflowRun

    run = WorkflowRun.objects.filter(workflow_id="bench-long-history").first()
    if run is not None:
        return str(run.pk)
    run = WorkflowRun.objects.create(workflow_id="bench-long-history", workflow_name="bench.orders")
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


def measure(requests: int, run_id: str) -> dict[str, tuple[float, float]]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.filter(
        username="bench"
    ).first() or get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(user)
    base = "/admin/django_weft/workflowrun/"
    kinds: dict[str, Any] = {
        "changelist first page": lambda i: client.get(base),
        "changelist status=failed": lambda i: client.get(base, {"status__exact": "failed"}),
        "changelist search wf id": lambda i: client.get(base, {"q": f"bench-{1 + (i * 37) % 5000}"}),
        "changelist customer=N": lambda i: client.get(base, {"q": f"customer={5 + (i * 5) % 5000}"}),
        "detail, 1,000 steps": lambda i: client.get(f"{base}{run_id}/change/"),
    }
    results = {}
    for name, call in kinds.items():
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


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--requests", type=int, default=100)
    options = parser.parse_args()
    setup_django()
    by_size = {}
    for size in sorted(options.sizes):
        api_bench.fill(size)
        by_size[size] = measure(options.requests, long_history_run())
    kinds = list(next(iter(by_size.values())))
    print(f"{'page':28}" + "".join(f"{f'{size:,} runs p50 / p99':>26}" for size in by_size))
    for kind in kinds:
        print(
            f"{kind:28}"
            + "".join(f"{by_size[s][kind][0]:>13.1f} / {by_size[s][kind][1]:6.1f} ms" for s in by_size)
        )
    summary = "; ".join(
        f"{kind}: " + " vs ".join(f"{by_size[s][kind][0]:.1f}/{by_size[s][kind][1]:.1f}" for s in by_size)
        for kind in kinds
    )
    print(f"admin.py: p50/p99 ms at {' vs '.join(f'{s:,}' for s in by_size)} runs: {summary}")


if __name__ == "__main__":
    main()
