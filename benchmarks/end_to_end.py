"""End to end: a client starts N runs of K inline no-op steps while one worker drains them.

Three parts against the same PostgreSQL server, one after another in each round, each in
a database of its own:

* **weft**: this process starts the runs with ``django_weft.client.start`` (django_weft's
  defaults beside ``weft_worker``: the sweep-only dispatcher and a work notice with each
  start); one ``manage.py weft_worker --threads T`` process drains them.
* **dbos**: this process enqueues the same workflow on a DBOS queue with
  ``DBOSClient.enqueue``; one worker process (``DBOS.launch()`` with the queue,
  ``worker_concurrency=T``, polling every ``--dbos-polling`` seconds) runs them.
* **pgbench**: ``pgbench -N -c 1 -T <seconds>``: the server's one-connection ceiling for
  small write transactions (an UPDATE, a SELECT and an INSERT, one commit each).

For weft and DBOS: steps per second from just before the first start to the last run's
end as the database recorded it, and the WAL the server wrote meanwhile
(``pg_current_wal_lsn()`` before and after; nothing else runs), per step and per run.
Each part has ``--warmup`` untimed runs first, on the same worker. The summary takes
medians over ``--rounds``; each ratio is the median of the per-round ratios. Usage (see
benchmarks/README.md)::

    .venv/bin/python benchmarks/end_to_end.py [--runs 200] [--steps 10] [--rounds 3]
        [--threads 1] [--warmup 10] [--pgbench-seconds 10] [--dbos-polling 0.005]
        [--skip-dbos] [--no-notify] [--quick]

The databases ``weft_e2e_bench``, ``dbos_e2e_bench`` and ``pgbench_bench`` are dropped and
recreated at every invocation; never point this script at a server you care about.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from steps import PgBench, Server, require_dbos  # noqa: E402

SETTINGS = "benchmarks.e2e_bench.settings"
WEFT_DB = os.environ.get("WEFT_E2E_BENCH_DB", "weft_e2e_bench")
DBOS_DB = "dbos_e2e_bench"
WORKFLOW = "bench.steps"
POLL_INTERVAL = 0.1
"""Seconds between the polls that wait for a part's runs to end (the figures come from the
times the database recorded, so a poll's delay adds nothing to them)."""
QUEUE = "bench"


@dataclass(frozen=True)
class Measure:
    """``runs`` runs of ``steps`` steps each, drained in ``seconds``, writing ``wal`` bytes,
    the server's processes using ``cpu`` seconds meanwhile (``None``: not measurable)."""

    runs: int
    steps: int
    seconds: float
    wal: int
    cpu: float | None = None

    @property
    def per_second(self) -> float:
        return self.runs * self.steps / self.seconds

    @property
    def wal_per_step(self) -> float:
        return self.wal / (self.runs * self.steps)

    @property
    def wal_per_run(self) -> float:
        return self.wal / self.runs

    @property
    def cpu_per_step(self) -> float | None:
        """The server's CPU µs per step (its share of the runs' fixed cost included)."""
        return None if self.cpu is None else 1e6 * self.cpu / (self.runs * self.steps)


def cpu_since(server: Server, before: float | None) -> float | None:
    after = server.cpu_seconds()
    return None if before is None or after is None else after - before


def wal_position(server: Server) -> str:
    with server.admin() as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def wal_since(server: Server, position: str) -> int:
    with server.admin() as conn:
        row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", [position]).fetchone()
    assert row is not None
    return int(row[0])


def wait_for(
    condition: Callable[[], bool],
    what: str,
    timeout: float,
    check: Callable[[], None],
    *,
    interval: float = 0.02,
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"still waiting after {timeout} s for {what}")
        time.sleep(interval)


class Process:
    """A worker subprocess in a session of its own, its output in a log file."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str]) -> None:
        self.log_path = log_dir / f"{name}.log"
        self.log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, *argv],
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env},
            cwd=REPO_ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def cpu_seconds(self) -> float:
        """The CPU time (user and system, every thread) the process has used so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.log_path.stem} exited:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()


# -- django_weft -----------------------------------------------------------------------


def setup_weft(server: Server, notify: bool) -> None:
    """A fresh database with the migrations applied, and Django set up in this process."""
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    os.environ["WEFT_E2E_BENCH_NOTIFY"] = "1" if notify else "0"
    server.drop_database(WEFT_DB)
    server.ensure_database(WEFT_DB)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def drain(count: int, steps: int, check: Callable[[], None], timeout: float = 600) -> tuple[list[str], float]:
    """Start ``count`` runs of ``steps`` inline steps and wait until all have completed;
    their ids and the time (``time.time()``) just before the first start."""
    from django_weft import client
    from django_weft.models import WorkflowRun

    began = time.time()
    ids = [client.start(WORKFLOW, args=[steps]).run_id for _ in range(count)]
    # The database holds this benchmark's runs only, so "no run unfinished" is the wait:
    # a query that stops at the first unfinished row. Asking after the ids themselves (a
    # query of `count` parameters every poll) cost this process and the server milliseconds
    # of CPU a poll, taken from the worker being measured. The figures come from the
    # recorded finish times, not from when this loop notices.
    unfinished = WorkflowRun.objects.filter(finished_at__isnull=True)
    wait_for(lambda: not unfinished.exists(), f"{count} weft runs", timeout, check, interval=POLL_INTERVAL)
    completed = WorkflowRun.objects.filter(pk__in=ids, status="completed").count()
    if completed != count:
        raise RuntimeError(f"{count - completed} of the {count} weft runs ended other than completed")
    return ids, began


def weft_part(server: Server, args: argparse.Namespace, log_dir: Path) -> Measure:
    from django.db.models import Max

    from django_weft.models import WorkflowRun

    worker = Process(
        "weft_worker",
        ["-m", "django", "weft_worker", "--threads", str(args.threads), "--log-level", "WARNING"],
        log_dir,
        {"DJANGO_SETTINGS_MODULE": SETTINGS},
    )
    try:
        drain(args.warmup, args.steps, worker.check_alive)
        position, cpu = wal_position(server), server.cpu_seconds()
        ids, began = drain(args.runs, args.steps, worker.check_alive)
        used = cpu_since(server, cpu)
        wal = wal_since(server, position)
        last = WorkflowRun.objects.filter(pk__in=ids).aggregate(last=Max("finished_at"))["last"]
    finally:
        worker.stop()
    return Measure(args.runs, args.steps, last.timestamp() - began, wal, used)


# -- DBOS Transact ---------------------------------------------------------------------


def dbos_worker(url: str, threads: int, polling: float) -> None:
    """The DBOS worker process: the workflow and its queue, launched, until SIGTERM."""
    from dbos import DBOS, DBOSConfig

    @DBOS.step(name="bench.noop")
    def noop(value: int) -> int:
        return value

    @DBOS.workflow(name=WORKFLOW)
    def steps(count: int) -> int:
        for index in range(count):
            noop(index)
        return count

    config: DBOSConfig = {
        "name": "weft-e2e-benchmark",
        "system_database_url": url,
        "log_level": "WARNING",
        "enable_otlp": False,
    }
    DBOS(config=config)
    DBOS.launch()
    DBOS.register_queue(QUEUE, worker_concurrency=threads, polling_interval_sec=polling)
    print("ready", flush=True)
    threading.Event().wait()


def dbos_part(server: Server, args: argparse.Namespace, log_dir: Path) -> Measure:
    from dbos import DBOSClient

    server.drop_database(DBOS_DB)
    url = server.url(DBOS_DB)
    argv = [str(Path(__file__).resolve()), "--dbos-worker", url, str(args.threads), str(args.dbos_polling)]
    worker = Process("dbos_worker", argv, log_dir, {})
    dbos_client: Any = None
    watcher: psycopg.Connection[Any] | None = None
    try:
        wait_for(lambda: b"ready" in worker.log_path.read_bytes(), "the DBOS worker", 120, worker.check_alive)
        # One connection for the polls, as the weft part has (a connection per poll made
        # the server start a backend every poll, CPU taken from the worker being measured).
        watcher = polls = psycopg.connect(url, autocommit=True)  # polls: never None, for the closures
        dbos_client = DBOSClient(system_database_url=url)
        options: Any = {"queue_name": QUEUE, "workflow_name": WORKFLOW}

        def succeeded(ids: list[str]) -> int:
            row = polls.execute(
                "SELECT count(*) FROM dbos.workflow_status "
                "WHERE workflow_uuid = ANY(%s) AND status = 'SUCCESS'",
                [ids],
            ).fetchone()
            assert row is not None
            return int(row[0])

        def drain(count: int) -> tuple[list[str], float]:
            began = time.time()
            ids = [dbos_client.enqueue(options, args.steps).get_workflow_id() for _ in range(count)]
            wait_for(
                lambda: succeeded(ids) == count,
                f"{count} DBOS workflows",
                600,
                worker.check_alive,
                interval=POLL_INTERVAL,
            )
            return ids, began

        drain(args.warmup)
        position, cpu = wal_position(server), server.cpu_seconds()
        ids, began = drain(args.runs)
        used = cpu_since(server, cpu)
        wal = wal_since(server, position)
        row = polls.execute(
            "SELECT max(updated_at), (SELECT count(*) FROM dbos.operation_outputs "
            "WHERE workflow_uuid = ANY(%s)) FROM dbos.workflow_status WHERE workflow_uuid = ANY(%s)",
            [ids, ids],
        ).fetchone()
        assert row is not None
        last_ms, outputs = row
        if outputs != args.runs * args.steps:
            raise RuntimeError(f"dbos: {outputs} steps recorded, expected {args.runs * args.steps}")
    finally:
        if dbos_client is not None:
            dbos_client.destroy()
        if watcher is not None:
            watcher.close()
        worker.stop()
    return Measure(args.runs, args.steps, last_ms / 1000 - began, wal, used)


# -- main ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="runs started (N), default 200")
    parser.add_argument("--steps", type=int, default=10, help="steps per run (K), default 10")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the parts, default 3")
    parser.add_argument("--threads", type=int, default=1, help="worker threads (DBOS: concurrency), 1")
    parser.add_argument("--warmup", type=int, default=10, help="untimed runs first in each part, default 10")
    parser.add_argument("--pgbench-seconds", type=int, default=10, help="pgbench -T, default 10")
    parser.add_argument(
        "--dbos-polling", type=float, default=0.005, help="the DBOS queue's polling interval, default 0.005 s"
    )
    parser.add_argument("--skip-dbos", action="store_true", help="leave the DBOS part out")
    parser.add_argument("--no-notify", action="store_true", help="weft without work notices")
    parser.add_argument("--quick", action="store_true", help="a CI-sized run: 40 runs, 1 round, pgbench 3 s")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.rounds, args.pgbench_seconds, args.warmup = 40, 1, 3, 3
    return args


def main(argv: list[str] | None = None) -> None:
    if argv is None and sys.argv[1:2] == ["--dbos-worker"]:
        url, threads, polling = sys.argv[2:5]
        dbos_worker(url, int(threads), float(polling))
        return
    args = parse_args(argv)
    if not args.skip_dbos:
        require_dbos()
    server = Server.from_env()
    setup_weft(server, notify=not args.no_notify)
    pgbench = PgBench(server)
    log_dir = Path(tempfile.mkdtemp(prefix="weft-e2e-"))
    print(
        f"PostgreSQL {server.version()}; N={args.runs} runs x K={args.steps} steps; {args.threads} worker "
        f"thread(s); notices {'off' if args.no_notify else 'on'}; DBOS queue polling {args.dbos_polling} s; "
        f"logs in {log_dir}",
        flush=True,
    )
    weft: list[Measure] = []
    dbos: list[Measure] = []
    tps: list[float] = []
    pgbench_cpu: list[float | None] = []
    for number in range(1, args.rounds + 1):
        weft.append(weft_part(server, args, log_dir))
        done = weft[-1]
        line = f"round {number}: weft {done.per_second:.0f} steps/s ({done.wal_per_step:.0f} B WAL/step, "
        line += f"{micros(done.cpu_per_step)} server CPU/step)"
        if not args.skip_dbos:
            dbos.append(dbos_part(server, args, log_dir))
            line += f", DBOS {dbos[-1].per_second:.0f} steps/s ({dbos[-1].wal_per_step:.0f} B WAL/step, "
            line += f"{micros(dbos[-1].cpu_per_step)} server CPU/step)"
        rate, cpu = pgbench.measure(args.pgbench_seconds)
        tps.append(rate)
        pgbench_cpu.append(cpu)
        print(f"{line}, pgbench -N -c1 {rate:.0f} TPS ({micros(cpu)} server CPU/transaction)", flush=True)

    def median(values: list[float]) -> float:
        return statistics.median(values)

    def median_cpu(values: list[float | None]) -> str:
        known = [value for value in values if value is not None]
        return micros(statistics.median(known) if known else None)

    weft_rate = median([m.per_second for m in weft])
    summary = (
        f"end to end, N={args.runs} x K={args.steps}, {args.threads} thread(s), {args.rounds} round(s): "
        f"weft {weft_rate:.0f} steps/s, WAL {median([m.wal_per_step for m in weft]):.0f} B/step "
        f"{median([m.wal_per_run for m in weft]):.0f} B/run"
    )
    if dbos:
        summary += (
            f"; DBOS {median([m.per_second for m in dbos]):.0f} steps/s, "
            f"WAL {median([m.wal_per_step for m in dbos]):.0f} B/step "
            f"{median([m.wal_per_run for m in dbos]):.0f} B/run"
        )
    summary += f"; pgbench -N -c1 {median(tps):.0f} TPS"
    summary += f"; server CPU weft {median_cpu([m.cpu_per_step for m in weft])}/step"
    if dbos:
        summary += f", DBOS {median_cpu([m.cpu_per_step for m in dbos])}/step"
    summary += f", pgbench {median_cpu(pgbench_cpu)}/transaction"
    if dbos:
        ratio = median([w.per_second / d.per_second for w, d in zip(weft, dbos, strict=True)])
        summary += f"; weft/DBOS {ratio:.2f}x"
    summary += f"; weft/pgbench {median([w.per_second / t for w, t in zip(weft, tps, strict=True)]):.2f}x"
    print(summary)


def micros(value: float | None) -> str:
    return "? µs" if value is None else f"{value:.0f} µs"


if __name__ == "__main__":
    main()
