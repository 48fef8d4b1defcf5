"""A million parked runs: the idle sweep's time, and 10,000 timers falling due at once.

The database gets ``--runs`` parked runs (1,000,000 by default): half sleep on a timer
1 to 10 hours away (``bench.parked``), half wait for a signal (``bench.awaits_signal``),
and ``--schedules`` schedules (100,000) whose next fire is hours away. One run of each
workflow is made by the engine itself (started, its first turn parks it); the others
are copies of its rows (run, steps, timer) made in SQL with new ids, each timer's time
drawn between 1 and 10 hours ahead; the schedules are copies of one made by
``runtime.create_schedule``. Then, measured:

* **idle sweep**: ``--ticks`` sweeps as ``weft_worker`` runs them (``tick`` with its
  workflows, redispatching at once) in this process, nothing being due: p50 and p99
  (the goal: 5 ms and 20 ms);
* **pages**: the admin's run changelist and the REST list of runs (first page, and
  filtered to waiting runs), ``--requests`` times each through Django's test client as
  a superuser, with the million parked runs in the table: p50 and p99, to compare with
  the 1,000,000-row figures of ``admin.py`` and ``api.py``;
* **timers falling due**: two ``weft_worker`` processes (``--threads`` each) idle, then
  ``--due`` (10,000) of the timers are moved to now in one statement; from its commit
  to the last of those timers fired, runs claimed, runs woken (their code running again:
  the step after the sleep begun) and runs ended, as the database recorded them (each
  run, woken, records its one step and completes): the goal is every one woken within
  5 s.

Usage (see benchmarks/README.md)::

    .venv/bin/python benchmarks/parked.py [--runs 1000000] [--schedules 100000] [--due 10000]
                                          [--ticks 200] [--threads 4] [--requests 50] [--tick-batch 100]
                                          [--quick]

It uses ``end_to_end.py``'s project (``benchmarks/e2e_bench/``) and drops and recreates
``weft_e2e_bench``; the tables take about 2 GB.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from end_to_end import SETTINGS, Process, setup_weft, wait_for  # noqa: E402
from steps import Server, weft_revision  # noqa: E402

RUN, STEP, TIMER, SCHEDULE = (
    "django_weft_workflowrun",
    "django_weft_step",
    "django_weft_timer",
    "django_weft_schedule",
)


def columns(cursor: object, table: str) -> list[str]:
    cursor.execute(  # type: ignore[attr-defined]
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
        [table],
    )
    return [row[0] for row in cursor.fetchall()]  # type: ignore[attr-defined]


FIRE_AT = "now() + interval '1 hour' + (abs(hashtext('{prefix}' || g)) %% 32400) * interval '1 second'"
"""A copy's wake-up time: 1 to 10 hours ahead, different for each copy ``g``."""


def iso(moment: str) -> str:
    """The SQL of ``moment`` as the engine writes a time in JSON (ISO 8601, UTC)."""
    return f"to_jsonb(to_char(({moment}) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"'))"


def copy_runs(cursor: object, template: str, prefix: str, count: int) -> None:
    """``count`` copies of run ``template`` (its row, steps and timers), ids derived from
    ``prefix`` and the copy's number; a sleeping one's sleep ends 1 to 10 hours ahead (its
    step, its ``waiting_on`` and its timer agree)."""
    key = f"md5('{prefix}' || g)::uuid"
    fire_at = FIRE_AT.format(prefix=prefix)
    run_columns = columns(cursor, RUN)

    def run_value(name: str) -> str:
        if name == "id":
            return key
        if name == "workflow_id":
            return f"'{prefix}' || g"
        if name == "waiting_on":
            return (
                "CASE WHEN t.waiting_on ? 'fire_at' THEN "
                f"jsonb_set(t.waiting_on, '{{fire_at}}', {iso(fire_at)}) ELSE t.waiting_on END"
            )
        return f"t.{name}"

    execute = cursor.execute  # type: ignore[attr-defined]
    execute(
        f"INSERT INTO {RUN} ({', '.join(run_columns)}) SELECT {', '.join(map(run_value, run_columns))} "
        f"FROM {RUN} t, generate_series(1, %s) g WHERE t.id = %s",
        [count, template],
    )
    step_columns = [name for name in columns(cursor, STEP) if name != "id"]

    def step_value(name: str) -> str:
        if name == "run_id":
            return key
        if name == "result":
            ended = f"jsonb_build_object('fire_at', {iso(fire_at)})"
            return f"CASE WHEN s.kind = 'sleep' THEN {ended} ELSE s.result END"
        return f"s.{name}"

    execute(
        f"INSERT INTO {STEP} ({', '.join(step_columns)}) SELECT {', '.join(map(step_value, step_columns))} "
        f"FROM {STEP} s, generate_series(1, %s) g WHERE s.run_id = %s",
        [count, template],
    )
    timer_columns = [name for name in columns(cursor, TIMER) if name != "id"]
    values = [
        key if name == "run_id" else fire_at if name == "fire_at" else f"x.{name}" for name in timer_columns
    ]
    execute(
        f"INSERT INTO {TIMER} ({', '.join(timer_columns)}) SELECT {', '.join(values)} "
        f"FROM {TIMER} x, generate_series(1, %s) g WHERE x.run_id = %s AND x.fired_at IS NULL",
        [count, template],
    )


def populate(runs: int, schedules: int) -> None:
    from django.db import connection

    from django_weft import client, runtime
    from django_weft.engine.executor import TurnOutcome
    from django_weft.testing import make_engine

    engine = make_engine()
    templates = []
    for workflow, args in (("bench.parked", [6]), ("bench.awaits_signal", [])):
        handle = client.start(workflow, args=args, id=f"template-{workflow}")
        if engine.run_turn(handle.run_id) != TurnOutcome.PARKED:
            raise RuntimeError(f"the template run of {workflow} did not park")
        templates.append(handle.run_id)
    runtime.create_schedule("template-schedule", "bench.parked", args=[6], cron="0 3 * * *")
    with connection.cursor() as cursor:
        copy_runs(cursor, templates[0], "parked-", runs // 2 - 1)
        copy_runs(cursor, templates[1], "signal-", runs - runs // 2 - 1)
        schedule_columns = columns(cursor, SCHEDULE)
        values = [
            "'schedule-' || g" if name == "id"
            else "now() + (1 + 23 * random()) * interval '1 hour'" if name == "next_fire_at"
            else f"t.{name}"
            for name in schedule_columns
        ]  # fmt: skip
        cursor.execute(
            f"INSERT INTO {SCHEDULE} ({', '.join(schedule_columns)}) SELECT {', '.join(values)} "
            f"FROM {SCHEDULE} t, generate_series(1, %s) g WHERE t.id = 'template-schedule'",
            [schedules - 1],
        )
        for table in (RUN, STEP, TIMER, SCHEDULE):
            cursor.execute(f"VACUUM ANALYZE {table}")


def idle_ticks(count: int) -> list[float]:
    from django_weft.engine.registry import registry
    from django_weft.runtime import tick
    from django_weft.runtime.dispatch import LocalDispatcher

    dispatcher = LocalDispatcher()
    names = registry.workflow_names()
    tick(dispatcher, redispatch_after=0.0, workflows=names)  # warm-up
    times = []
    for _ in range(count):
        began = time.perf_counter()
        report = tick(dispatcher, redispatch_after=0.0, workflows=names)
        times.append(time.perf_counter() - began)
        if report.fired or report.dispatched:
            raise RuntimeError(f"an idle sweep found work: {report}")
    return times


@dataclass(frozen=True)
class Wake:
    """What waking the runs whose timers were moved to now took."""

    fired_in: float
    """Seconds from the move's commit to the last of those timers fired by a sweep (the
    run made runnable, for a worker's thread to claim)."""
    claimed_in: float
    """Seconds from the move's commit to the last of those runs' claims (a worker's sweep
    claims the runs it queues for its threads: a claimed run may still wait its turn)."""
    woken_in: float
    """Seconds from the move's commit to the last of those runs' code running again: the
    start of the step after the sleep."""
    completed_in: float
    """Seconds from the move's commit to the last of those runs' ends."""
    runs: int
    server_cpu: float | None
    """CPU seconds the server's processes used from the move to the last end (``None``
    when the server is not on this machine)."""
    workers_cpu: float
    """CPU seconds both ``weft_worker`` processes used over the same time."""

    def per_run(self, seconds: float | None) -> str:
        return "?" if seconds is None else f"{1_000_000 * seconds / self.runs:.0f}"


def timers_due(server: Server, due: int, threads: int, log_dir: Path) -> Wake:
    """Move ``due`` timers to now while two ``weft_worker`` processes run, and measure
    their runs' wake-up (:class:`Wake`)."""
    from django.db import connection
    from django.db.models import Max

    from django_weft.models import Step, Timer, WorkflowRun

    workers = [
        Process(
            f"weft_worker-{index}",
            ["-m", "django", "weft_worker", "--threads", str(threads), "--log-level", "WARNING"],
            log_dir,
            {"DJANGO_SETTINGS_MODULE": SETTINGS},
        )
        for index in range(2)
    ]

    def alive() -> None:
        for worker in workers:
            worker.check_alive()

    try:
        time.sleep(5)  # both workers up, listening and sweeping, with nothing due
        server_cpu = server.cpu_seconds()
        workers_cpu = sum(worker.cpu_seconds() for worker in workers)
        with connection.cursor() as cursor:
            # Their sleeps end now: the timer, the sleep's step and the run's waiting_on, in
            # one transaction (the engine honours the step's time, not the timer's).
            cursor.execute("BEGIN")
            cursor.execute(
                f"UPDATE {TIMER} SET fire_at = now() WHERE id IN (SELECT id FROM {TIMER} "
                f"WHERE fired_at IS NULL AND run_id IN (SELECT id FROM {RUN} "
                "WHERE workflow_id LIKE 'parked-%%' AND status = 'waiting') LIMIT %s) RETURNING run_id",
                [due],
            )
            ids = [row[0] for row in cursor.fetchall()]
            cursor.execute(
                f"UPDATE {STEP} SET result = jsonb_build_object('fire_at', {iso('now()')}) "
                "WHERE kind = 'sleep' AND run_id = ANY(%s)",
                [ids],
            )
            cursor.execute(
                f"UPDATE {RUN} SET waiting_on = jsonb_set(waiting_on, '{{fire_at}}', {iso('now()')}) "
                "WHERE id = ANY(%s)",
                [ids],
            )
            cursor.execute("SELECT now()")
            (moved_at,) = cursor.fetchone()
            cursor.execute("COMMIT")
            # The runs to wait for, kept by the server: a poll that sent their ids each time
            # (a query of 10,000 parameters, 30 to 50 ms of this process's CPU and more of
            # the server's) took the CPU the workers measured here need.
            cursor.execute("CREATE TEMPORARY TABLE due_runs (id uuid PRIMARY KEY)")
            cursor.execute("INSERT INTO due_runs SELECT unnest(%s::uuid[])", [ids])
            # Without statistics the planner took the temporary table for a large one and
            # joined it by hashing the whole run table: 340 ms of the server's CPU a poll
            # beside a million runs, taken from the wake being measured. Analyzed, each
            # poll looks the runs up by key and stops at the first one not completed.
            cursor.execute("ANALYZE due_runs")

        def all_completed() -> bool:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT NOT EXISTS (SELECT 1 FROM due_runs JOIN {RUN} run USING (id) "
                    "WHERE run.status <> 'completed')"
                )
                return bool(cursor.fetchone()[0])

        wait_for(all_completed, f"{due} woken runs", 600, alive, interval=0.5)
        workers_cpu = sum(worker.cpu_seconds() for worker in workers) - workers_cpu
        server_now = server.cpu_seconds()
        server_used = None if server_now is None or server_cpu is None else server_now - server_cpu
        woken = WorkflowRun.objects.filter(pk__in=ids)
        last = woken.aggregate(claimed=Max("claimed_at"), finished=Max("finished_at"))
        fired = Timer.objects.filter(run_id__in=ids, kind=Timer.Kind.SLEEP).aggregate(last=Max("fired_at"))
        resumed = Step.objects.filter(run_id__in=ids, kind="activity").aggregate(last=Max("started_at"))
    finally:
        for worker in workers:
            worker.stop()
    return Wake(
        fired_in=(fired["last"] - moved_at).total_seconds() if fired["last"] is not None else float("nan"),
        claimed_in=(last["claimed"] - moved_at).total_seconds(),
        woken_in=(resumed["last"] - moved_at).total_seconds(),
        completed_in=(last["finished"] - moved_at).total_seconds(),
        runs=len(ids),
        server_cpu=server_used,
        workers_cpu=workers_cpu,
    )


def time_pages(requests: int) -> dict[str, list[float]]:
    """Seconds per request of the admin changelist and the REST list, first page and
    waiting runs, through Django's test client as a superuser (after 5 untimed each)."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
    browser = Client()
    browser.force_login(user)
    pages = {
        "admin changelist": "/admin/django_weft/workflowrun/",
        "admin changelist status=waiting": "/admin/django_weft/workflowrun/?status__exact=waiting",
        "REST list": "/api/weft/runs/",
        "REST list status=waiting": "/api/weft/runs/?status=waiting",
    }
    times: dict[str, list[float]] = {}
    for name, url in pages.items():
        for _ in range(5):
            browser.get(url)
        times[name] = []
        for _ in range(requests):
            began = time.perf_counter()
            response = browser.get(url)
            times[name].append(time.perf_counter() - began)
            if response.status_code != 200:
                raise RuntimeError(f"{name}: {response.status_code} {response.content[:300]!r}")
    return times


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="parked runs (1000000)")
    parser.add_argument("--schedules", type=int, default=100_000, help="schedules (100000)")
    parser.add_argument("--due", type=int, default=10_000, help="timers moved to now (10000)")
    parser.add_argument("--ticks", type=int, default=200, help="idle sweeps timed (200)")
    parser.add_argument("--threads", type=int, default=4, help="threads of each weft_worker (4)")
    parser.add_argument(
        "--requests", type=int, default=50, help="requests timed per page (50); 0 skips the pages"
    )
    parser.add_argument(
        "--tick-batch", type=int, default=100, help="WEFT_TICK_BATCH of the sweeps (100, the default)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a CI-sized run: 20,000 runs, 1,000 schedules, 2,000 due, 50 sweeps, 5 requests, batch 1000",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.schedules, args.due, args.ticks, args.requests = 20_000, 1000, 2000, 50, 5
        args.tick_batch = 1000
    # Read by the settings, in this process and in the workers.
    os.environ["WEFT_E2E_BENCH_TICK_BATCH"] = str(args.tick_batch)
    server = Server.from_env()
    os.environ["WEFT_E2E_BENCH_PAGES"] = "1"  # the admin and the REST API, for the pages
    setup_weft(server, notify=True)
    import benchmarks.e2e_bench.workflows  # noqa: F401  (the workflows, registered)

    log_dir = Path(tempfile.mkdtemp(prefix="weft-parked-bench-"))
    print(f"PostgreSQL {server.version()}; {weft_revision()}; {args.runs} parked runs, {args.schedules} "
          f"schedules; logs in {log_dir}", flush=True)  # fmt: skip
    began = time.monotonic()
    populate(args.runs, args.schedules)
    print(f"populated in {time.monotonic() - began:.0f} s", flush=True)
    ticks = idle_ticks(args.ticks)
    print(f"idle sweep: p50 {percentile(ticks, 0.5):.1f} ms p99 {percentile(ticks, 0.99):.1f} ms "
          f"(mean {1000 * statistics.fmean(ticks):.1f} ms)", flush=True)  # fmt: skip
    pages = time_pages(args.requests) if args.requests else {}
    for name, times in pages.items():
        print(f"{name}: p50 {percentile(times, 0.5):.1f} ms p99 {percentile(times, 0.99):.1f} ms", flush=True)
    wake = timers_due(server, args.due, args.threads, log_dir)
    cpu = (
        f"CPU per run: server {wake.per_run(wake.server_cpu)} µs, workers {wake.per_run(wake.workers_cpu)} µs"
    )
    print(f"{wake.runs} timers due at once: all fired in {wake.fired_in:.2f} s, claimed in "
          f"{wake.claimed_in:.2f} s, all runs woken (the step after the sleep begun) in "
          f"{wake.woken_in:.2f} s, completed in {wake.completed_in:.2f} s; {cpu}", flush=True)  # fmt: skip
    p50, p99 = percentile(ticks, 0.5), percentile(ticks, 0.99)
    print(
        f"parked: {args.runs} runs, {args.schedules} schedules | "
        f"idle sweep p50 {p50:.1f} ms, p99 {p99:.1f} ms "
        f"({p50 / 5:.2f}x and {p99 / 20:.2f}x of the goals, 5 and 20 ms) | "
        f"{wake.runs} timers due: fired in {wake.fired_in:.2f} s, claimed in {wake.claimed_in:.2f} s, "
        f"woken in {wake.woken_in:.2f} s ({wake.woken_in / (5 * wake.runs / 10_000):.2f}x of the goal, "
        "5 s for 10,000), "
        f"completed in {wake.completed_in:.2f} s with 2 weft_worker x {args.threads}, tick batch "
        f"{args.tick_batch}, {cpu}"
        + (" | p50 " if pages else "")
        + ", ".join(f"{name} {percentile(times, 0.5):.1f} ms" for name, times in pages.items())
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
