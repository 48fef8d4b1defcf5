"""Workflows through real Celery workers: django_weft against a Celery chain and DBOS.

Three workloads of the same shape, N of each, K no-op steps apiece (``--steps``, 3):

* **weft**: N runs of ``bench.three_steps`` (three inline activities; ``bench.steps``
  for another K) started with
  ``django_weft.client.start``; a real ``celery worker`` (prefork, ``--concurrency``
  processes, Redis broker, PostgreSQL) runs the turns, ``celery beat`` the sweep.
  Durable: every step is recorded, a crash resumes where it stopped.
* **chain**: N Celery ``chain``s of K no-op tasks on the same worker and broker.
  Not durable: a lost message or a crash loses the chain's progress.
* **DBOS**: N DBOS Transact workflows of K ``@DBOS.step``s, run from 8 threads in
  this process (DBOS has no broker; its executor is the calling thread).

Each part reports workflows per second (N over first start to last completion) and the
p50/p99 start-to-completion latency. The parts alternate for ``--rounds`` rounds; the
summary takes medians. Usage (see benchmarks/README.md)::

    .venv/bin/python benchmarks/celery_throughput.py [--workflows 500] [--concurrency 2]
                                                     [--rounds 3] [--steps 3] [--skip-dbos] [--quick]

The database ``weft_celery_bench`` is dropped and recreated and Redis database 14
flushed at every invocation (``WEFT_BENCH_DB`` and ``WEFT_BENCH_BROKER_URL`` override).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from steps import Server  # noqa: E402

SETTINGS = "benchmarks.celery_bench.settings"
DBOS_DB = "dbos_celery_bench"


@dataclass(frozen=True)
class Result:
    workflows: int
    seconds: float
    latencies: list[float]

    @property
    def per_second(self) -> float:
        return self.workflows / self.seconds

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(int(q * len(ordered)), len(ordered) - 1)]

    def describe(self) -> str:
        p50, p99 = self.percentile(0.5), self.percentile(0.99)
        return f"{self.per_second:7.1f} wf/s  p50 {p50:6.1f} ms  p99 {p99:7.1f} ms"


# -- set-up ----------------------------------------------------------------------------


def setup(server: Server) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    database = os.environ.get("WEFT_BENCH_DB", "weft_celery_bench")
    server.drop_database(database)
    server.ensure_database(database)
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    import redis

    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    import benchmarks.celery_bench.app  # noqa: F401  (the app that sends the messages)


class Cluster:
    """One ``celery worker`` and one ``celery beat`` subprocess."""

    def __init__(self, concurrency: int, log_dir: Path) -> None:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS, "PYTHONPATH": str(REPO_ROOT)}
        common = [sys.executable, "-m", "celery", "-A", "benchmarks.celery_bench.app"]
        worker = ["worker", "-P", "prefork", "-c", str(concurrency), "-l", "INFO", "-n", "bench@%h"]
        worker += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        beat = ["beat", "-l", "WARNING", "-s", str(log_dir / "beat-schedule")]
        self.log_path = log_dir / "worker.log"
        self.log = self.log_path.open("wb")
        self.processes = [
            subprocess.Popen(
                [*common, *argv],
                env=env,
                cwd=REPO_ROOT,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for argv in (worker, beat)
        ]

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while " ready." not in self.log_path.read_text(errors="replace"):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                raise RuntimeError(f"the worker did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        self.log.close()


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    # The figures come from recorded completion times, not from when this loop notices,
    # so it polls slowly: a tight loop would take CPU from the workers and the database.
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


# -- the parts -------------------------------------------------------------------------


def bench_weft(count: int, steps: int = 3) -> Result:
    from django_weft import client
    from django_weft.models import Step, WorkflowRun

    began = time.time()
    if steps == 3:
        run_ids = [client.start("bench.three_steps", args=[i]).run_id for i in range(count)]
    else:
        run_ids = [client.start("bench.steps", args=[i, steps]).run_id for i in range(count)]
    keys = [uuid.UUID(run_id) for run_id in run_ids]
    runs = WorkflowRun.objects.filter(pk__in=keys)
    wait_until(lambda: runs.filter(status="completed").count() == count, 120, "the weft runs")
    rows = list(runs.values_list("created_at", "finished_at"))
    if Step.objects.filter(run_id__in=keys, status="completed").count() != steps * count:
        raise RuntimeError("weft: not every step was recorded")
    finished = max(done for _, done in rows).timestamp()
    return Result(count, finished - began, [(done - created).total_seconds() for created, done in rows])


def bench_chain(count: int, steps: int = 3) -> Result:
    import redis
    from celery import chain
    from django.conf import settings

    from benchmarks.celery_bench.tasks import chain_done, chain_noop

    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete("bench:chains-done")
    started: dict[str, float] = {}
    began = time.time()
    for i in range(count):
        chain_id = uuid.uuid4().hex
        started[chain_id] = time.time()
        noops = [chain_noop.s(i), *(chain_noop.s() for _ in range(steps - 2))]
        chain(*noops, chain_done.s(chain_id)).apply_async()
    wait_until(lambda: broker.llen("bench:chains-done") == count, 120, "the chains")
    done = {}
    for entry in broker.lrange("bench:chains-done", 0, -1):
        chain_id, moment = entry.decode().split()
        done[chain_id] = float(moment)
    return Result(count, max(done.values()) - began, [done[c] - started[c] for c in started])


class Dbos:
    def __init__(self, server: Server, threads: int, steps: int = 3) -> None:
        from dbos import DBOS, DBOSConfig

        server.drop_database(DBOS_DB)

        @DBOS.step(name="bench.noop")
        def noop(value: int) -> int:
            return value

        @DBOS.workflow(name="bench.three_steps")
        def three_steps(value: int) -> int:
            for _ in range(steps):
                value = noop(value)
            return value

        config: DBOSConfig = {
            "name": "weft-celery-benchmark",
            "system_database_url": server.url(DBOS_DB),
            "log_level": "WARNING",
            "enable_otlp": False,
        }
        DBOS(config=config)
        DBOS.launch()
        self.workflow = three_steps
        self.pool = ThreadPoolExecutor(threads)

    def bench(self, count: int) -> Result:
        def one(value: int) -> float:
            began = time.time()
            self.workflow(value)
            return time.time() - began

        began = time.time()
        latencies = list(self.pool.map(one, range(count)))
        return Result(count, time.time() - began, latencies)

    def close(self) -> None:
        from dbos import DBOS

        self.pool.shutdown()
        DBOS.destroy(destroy_registry=True)


# -- main ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workflows", type=int, default=500, help="workflows per part and round (500)")
    parser.add_argument("--concurrency", type=int, default=2, help="Celery worker processes (2)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians (3)")
    parser.add_argument("--dbos-threads", type=int, default=8, help="DBOS executor threads (8)")
    parser.add_argument("--steps", type=int, default=3, help="steps per workflow (3; 2 at least)")
    parser.add_argument("--skip-dbos", action="store_true", help="do not run the DBOS part")
    parser.add_argument("--quick", action="store_true", help="a CI-sized run: 100 workflows, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.workflows, args.rounds = 100, 1
    if args.steps < 2:
        parser.error("--steps: 2 at least (a chain's last task records its end)")
    server = Server.from_env()
    setup(server)
    import tempfile

    log_dir = Path(tempfile.mkdtemp(prefix="weft-celery-bench-"))
    cluster = Cluster(args.concurrency, log_dir)
    dbos = None
    print(
        f"PostgreSQL {server.version()}, Redis broker; {os.cpu_count()} CPUs; celery worker prefork "
        f"x{args.concurrency}; N={args.workflows} workflows of {args.steps} steps; {args.rounds} round(s); "
        f"logs in {log_dir}",
        flush=True,
    )
    try:
        cluster.wait_ready()
        if not args.skip_dbos:
            dbos = Dbos(server, args.dbos_threads, args.steps)
            dbos.bench(50)
        bench_weft(50, args.steps)  # warm-up: every pool process connects and imports
        bench_chain(50, args.steps)
        results: dict[str, list[Result]] = {"weft": [], "chain": [], "dbos": []}
        for round_no in range(1, args.rounds + 1):
            results["weft"].append(bench_weft(args.workflows, args.steps))
            results["chain"].append(bench_chain(args.workflows, args.steps))
            if dbos is not None:
                results["dbos"].append(dbos.bench(args.workflows))
            line = "  ".join(f"{name} {rs[-1].describe()}" for name, rs in results.items() if rs)
            print(f"round {round_no}: {line}", flush=True)
    finally:
        cluster.stop()
        if dbos is not None:
            dbos.close()

    print(summarise(results, args.dbos_threads))
    return 0


def summarise(results: dict[str, list[Result]], dbos_threads: int) -> str:
    """The one summary line: medians over rounds, and the median per-round ratios."""

    def part(name: str, label: str) -> str:
        rounds = results[name]
        rate = statistics.median(r.per_second for r in rounds)
        p50 = statistics.median(r.percentile(0.5) for r in rounds)
        p99 = statistics.median(r.percentile(0.99) for r in rounds)
        return f"{label} {rate:.0f} wf/s (p50 {p50:.1f} ms, p99 {p99:.1f} ms)"

    def ratio(other: str) -> float:
        pairs = zip(results["weft"], results[other], strict=True)
        return statistics.median(w.per_second / o.per_second for w, o in pairs)

    parts = [part("weft", "weft"), part("chain", "chain")]
    ratios = [f"weft/chain {ratio('chain'):.2f}x"]
    if results["dbos"]:
        parts.append(part("dbos", f"dbos x{dbos_threads}"))
        ratios.append(f"weft/dbos {ratio('dbos'):.2f}x")
    return "celery_throughput: " + " | ".join(parts) + " | " + ", ".join(ratios)


if __name__ == "__main__":
    raise SystemExit(main())
