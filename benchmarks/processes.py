"""More worker processes: 1, 2 and 4 ``weft_worker`` processes of 2 threads each drain N
runs of K inline no-op steps, against ``pgbench -N`` with 2, 4 and 8 clients, in one run.

For each process count P (``--processes``, default ``1,2,4``): this process starts N runs
(2,000 by default) with ``django_weft.client.start`` while P ``weft_worker --threads T``
processes (T = ``--threads``, 2) drain them; steps per second from just before the first
start to the last run's end as the database recorded it. Meanwhile a sampler reads
``pg_stat_activity`` every 20 ms and counts, for the weft database's active backends,
what each waits on (``wait_event_type:wait_event``, or ``CPU`` when it waits on nothing):
a hot row shows as ``Lock:tuple`` or ``Lock:transactionid`` waits. Then
``pgbench -N -c C -j C`` with C = P x T clients for ``--pgbench-seconds``. The summary
gives, per P, weft's steps/s, pgbench's TPS, their ratio (the goal: 0.8x or more at each)
and the most frequent waits.

Usage (see benchmarks/README.md)::

    .venv/bin/python benchmarks/processes.py [--processes 1,2,4] [--threads 2] [--runs 2000]
                                             [--steps 10] [--pgbench-seconds 10] [--quick]

It uses ``end_to_end.py``'s project (``benchmarks/e2e_bench/``) and drops and recreates
``weft_e2e_bench`` and ``pgbench_bench``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

import psycopg

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from end_to_end import SETTINGS, WEFT_DB, Process, drain, setup_weft  # noqa: E402
from steps import PgBench, Server, weft_revision  # noqa: E402


class WaitSampler:
    """Counts what the weft database's active backends wait on, every ``every`` seconds."""

    def __init__(self, server: Server, every: float = 0.02) -> None:
        self.counts: Counter[str] = Counter()
        self.samples = 0
        self._server, self._every = server, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WaitSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        with psycopg.connect(self._server.url("postgres"), autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity "
                    "WHERE datname = %s AND state = 'active' AND backend_type = 'client backend' "
                    "AND pid <> pg_backend_pid()",
                    [WEFT_DB],
                ).fetchall()
                self.samples += 1
                self.counts.update(row[0] for row in rows)
                self._stop.wait(self._every)

    def top(self, count: int = 4) -> str:
        total = sum(self.counts.values()) or 1
        return ", ".join(f"{name} {100 * seen / total:.0f}%" for name, seen in self.counts.most_common(count))

    def lock_waits(self) -> int:
        return sum(seen for name, seen in self.counts.items() if name.startswith("Lock:"))


def weft_part(
    server: Server, processes: int, args: argparse.Namespace, log_dir: Path
) -> tuple[float, WaitSampler]:
    from django.db.models import Max

    from django_weft.models import WorkflowRun

    workers = [
        Process(
            f"weft_worker-{processes}-{index}",
            ["-m", "django", "weft_worker", "--threads", str(args.threads), "--log-level", "WARNING"],
            log_dir,
            {"DJANGO_SETTINGS_MODULE": SETTINGS},
        )
        for index in range(processes)
    ]

    def alive() -> None:
        for worker in workers:
            worker.check_alive()

    try:
        drain(args.warmup, args.steps, alive)
        with WaitSampler(server) as sampler:
            ids, began = drain(args.runs, args.steps, alive, timeout=1800)
        last = WorkflowRun.objects.filter(pk__in=ids).aggregate(last=Max("finished_at"))["last"]
    finally:
        for worker in workers:
            worker.stop()
    return args.runs * args.steps / (last.timestamp() - began), sampler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", default="1,2,4", help="weft_worker process counts (1,2,4)")
    parser.add_argument("--threads", type=int, default=2, help="threads per weft_worker (2)")
    parser.add_argument("--runs", type=int, default=2000, help="runs per part (2000)")
    parser.add_argument("--steps", type=int, default=10, help="inline no-op steps per run (10)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed runs first in each part (20)")
    parser.add_argument("--pgbench-seconds", type=int, default=10, help="pgbench -T (10)")
    parser.add_argument(
        "--no-notify", action="store_true", help="weft without work notices (sweeps find the runs)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a CI-sized run: 1 and 2 processes, 200 runs, pgbench 3 s"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.processes, args.runs, args.warmup, args.pgbench_seconds = "1,2", 200, 5, 3
    counts = [int(value) for value in args.processes.split(",")]
    server = Server.from_env()
    setup_weft(server, notify=not args.no_notify)
    pgbench = PgBench(server)
    log_dir = Path(tempfile.mkdtemp(prefix="weft-processes-bench-"))
    print(f"PostgreSQL {server.version()}; {weft_revision()}; N={args.runs} x K={args.steps}; "
          f"{args.threads} threads per weft_worker; notices {'off' if args.no_notify else 'on'}; "
          f"logs in {log_dir}", flush=True)  # fmt: skip
    parts = []
    for processes in counts:
        rate, sampler = weft_part(server, processes, args, log_dir)
        clients = processes * args.threads
        tps = pgbench.tps(args.pgbench_seconds, clients=clients)
        line = (
            f"{processes} x {args.threads}: weft {rate:.0f} steps/s, pgbench -N -c{clients} {tps:.0f} TPS, "
            f"{rate / tps:.2f}x; waits {sampler.top()} ({sampler.lock_waits()} lock waits in "
            f"{sampler.samples} samples)"
        )
        print(line, flush=True)
        parts.append(f"{processes}x{args.threads} {rate:.0f}/{tps:.0f} {rate / tps:.2f}x")
    print(f"processes, N={args.runs} x K={args.steps}: " + " | ".join(parts) + " (goal 0.8x or more at each)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
