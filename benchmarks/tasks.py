"""Backends of Django's task framework side by side: django_weft, django-tasks-db, Celery.

The same no-op task (it returns its argument) through three systems on the same
machine, each with one worker process:

* **weft**: ``django_weft.tasks.WeftTaskBackend`` as the ``default`` backend, run by one
  ``manage.py weft_worker --threads T`` with django_weft's defaults (the enqueue's
  ``NOTIFY`` wakes the worker at commit; the sweep runs every second). Durable: the task
  is a recorded run, claimed with an epoch and recovered if its worker dies.
* **django-tasks-db**: ``django_tasks_db.DatabaseBackend`` (the ``db`` backend), run by one
  ``manage.py db_worker`` (one task at a time; an idle worker polls every
  ``--poll-interval``). A task left RUNNING by a dead worker stays so.
* **celery**: ``delay()`` of a Celery task on Redis, one ``celery worker`` process (pool
  ``--celery-pool``, concurrency T), no result backend. Not durable: with Celery's
  default early acknowledgement a crash loses the tasks the worker had taken.

The weft and django-tasks-db parts use the framework's API only (``Task.enqueue``,
``TaskResult.refresh``, ``started_at``, ``finished_at``). Three measurements per part
and round:

* **throughput**: ``--tasks`` tasks enqueued by this process as fast as it can, while
  the worker drains them; tasks per second from the first ``enqueue()`` call to the
  last ``finished_at``.
* **drain**: ``--tasks`` tasks enqueued while the worker is stopped (SIGSTOP), then tasks
  per second from its SIGCONT to the last ``finished_at``: the worker alone.
* **latency**: ``--latency-tasks`` tasks enqueued one at a time, ``--rate`` per second,
  without waiting for them; each task's latency runs from just before its
  ``enqueue()`` (or ``delay()``) call in this process to the ``finished_at`` its worker
  recorded (Celery: the time its task pushed to Redis). Same machine, same clock.

The parts alternate for ``--rounds`` rounds after a warm-up; the summary takes medians,
and each ratio is the median of the per-round ratios. Usage (see benchmarks/README.md)::

    .venv/bin/python benchmarks/tasks.py [--tasks 2000] [--latency-tasks 200] [--rate 20]
                                         [--rounds 3] [--threads 4] [--poll-interval 0.1]

The database ``weft_tasks_bench`` is dropped and recreated and Redis database 13 flushed
at every invocation (``WEFT_TASKS_BENCH_DB`` and ``WEFT_TASKS_BENCH_BROKER_URL``
override).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, Protocol

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import admin_connection  # noqa: E402

SETTINGS = "benchmarks.tasks_bench.settings"
PARTS = ("weft", "django-tasks-db", "celery")
KINDS = ("throughput", "drain", "latency")


@dataclass(frozen=True)
class Result:
    tasks: int
    seconds: float
    """From the first enqueue() call to the last recorded finish."""
    enqueue_seconds: float
    """What this process took to enqueue them all."""
    latencies: list[float]
    """Per task: from just before its enqueue() call to its recorded finish."""
    to_start: list[float] | None = None
    """Per task: from just before its enqueue() call to its ``started_at`` (the framework's
    backends record it; Celery's part does not)."""

    @property
    def per_second(self) -> float:
        return self.tasks / self.seconds

    def percentile(self, q: float, of: list[float] | None = None) -> float:
        ordered = sorted(self.latencies if of is None else of)
        return 1000 * ordered[min(int(q * len(ordered)), len(ordered) - 1)]

    def describe(self) -> str:
        started = f" (started p50 {self.percentile(0.5, self.to_start):.1f} ms)" if self.to_start else ""
        return (
            f"{self.per_second:6.0f} tasks/s (enqueue {self.tasks / self.enqueue_seconds:5.0f}/s) "
            f"p50 {self.percentile(0.5):7.1f} ms p99 {self.percentile(0.99):7.1f} ms{started}"
        )


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, every: float = 0.2) -> None:
    # The figures come from recorded finish times, not from when this loop notices, so it
    # polls slowly: it shares the two CPUs with the worker and the database.
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


# -- the parts -------------------------------------------------------------------------


class Part(Protocol):
    name: str

    def reset(self) -> None:
        """Forget the finish records of the previous measurement."""

    def send(self, value: int) -> Any:
        """Enqueue the no-op task with ``value``; a handle for :meth:`finished_times`."""

    def finished_times(self, handles: Sequence[Any], timeout: float) -> list[float]:
        """Wait until every task finished; their finish times (epoch seconds), in order."""

    def started_times(self, handles: Sequence[Any]) -> list[float] | None:
        """After :meth:`finished_times`: when each task started, where that is recorded."""


class FrameworkPart:
    """A backend of Django's task framework, through the framework's API only."""

    def __init__(self, name: str, task: Any) -> None:
        self.name = name
        self.task = task

    def reset(self) -> None:
        pass

    def send(self, value: int) -> Any:
        return self.task.enqueue(value)

    def finished_times(self, handles: Sequence[Any], timeout: float) -> list[float]:
        # Waiting on the last one first costs one query per poll while the worker drains
        # the queue; the others are then (nearly) all done and are read once each.
        wait_until(lambda: self._succeeded(handles[-1]), timeout, f"{self.name}: the last task")
        for result in handles:
            what = f"{self.name}: task {result.id}"
            wait_until(lambda result=result: self._succeeded(result), timeout, what)
        return [result.finished_at.timestamp() for result in handles]

    def started_times(self, handles: Sequence[Any]) -> list[float] | None:
        return [result.started_at.timestamp() for result in handles]

    @staticmethod
    def _succeeded(result: Any) -> bool:
        result.refresh()
        if result.status == "FAILED":
            raise RuntimeError(f"task {result.id} failed: {result.errors}")
        return bool(result.status == "SUCCESSFUL")


class CeleryPart:
    name = "celery"

    def __init__(self) -> None:
        import redis
        from django.conf import settings

        from benchmarks.tasks_bench.tasks import CELERY_DONE_KEY, celery_noop

        self.broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        self.done_key = CELERY_DONE_KEY
        self.task = celery_noop

    def reset(self) -> None:
        self.broker.delete(self.done_key)

    def send(self, value: int) -> Any:
        self.task.delay(value)
        return value

    def finished_times(self, handles: Sequence[Any], timeout: float) -> list[float]:
        count = len(handles)
        wait_until(lambda: self.broker.llen(self.done_key) >= count, timeout, "celery: the tasks")
        done: dict[int, float] = {}
        for entry in self.broker.lrange(self.done_key, 0, -1):
            value, moment = entry.decode().split()
            done[int(value)] = float(moment)
        return [done[value] for value in handles]

    def started_times(self, handles: Sequence[Any]) -> list[float] | None:
        return None


def measure_throughput(part: Part, count: int) -> Result:
    part.reset()
    sent: list[float] = []
    handles: list[Any] = []
    began = time.time()
    for value in range(count):
        sent.append(time.time())
        handles.append(part.send(value))
    enqueued = time.time() - began
    finished = part.finished_times(handles, timeout=max(60.0, count / 10))
    return Result(count, max(finished) - began, enqueued, *latencies(part, handles, sent, finished))


def measure_drain(part: Part, worker: Worker, count: int) -> Result:
    """The worker alone: ``count`` tasks enqueued while it is stopped (SIGSTOP), then how
    fast it clears them once it continues; latencies run from that moment."""
    part.reset()
    handles: list[Any] = []
    worker.pause()
    try:
        began = time.time()
        handles = [part.send(value) for value in range(count)]
        enqueued = time.time() - began
    finally:
        resumed = time.time()
        worker.resume()
    finished = part.finished_times(handles, timeout=max(60.0, count / 10))
    return Result(count, max(finished) - resumed, enqueued, [done - resumed for done in finished])


def measure_latency(part: Part, count: int, rate: float, timeout: float = 60.0) -> Result:
    part.reset()
    sent: list[float] = []
    handles: list[Any] = []
    began = time.time()
    enqueue_time = 0.0
    for value in range(count):
        # On a fixed schedule (not "rate after the previous one"), so a slow enqueue does
        # not lower the rate.
        delay = began + value / rate - time.time()
        if delay > 0:
            time.sleep(delay)
        sent.append(time.time())
        handles.append(part.send(value))
        enqueue_time += time.time() - sent[-1]
    finished = part.finished_times(handles, timeout=timeout)
    return Result(count, max(finished) - began, enqueue_time, *latencies(part, handles, sent, finished))


def latencies(
    part: Part, handles: Sequence[Any], sent: list[float], finished: list[float]
) -> tuple[list[float], list[float] | None]:
    """From each enqueue() call to the task's finish, and to its start where recorded."""
    started = part.started_times(handles)
    to_start = None if started is None else [at - s for s, at in zip(sent, started, strict=True)]
    return [done - s for s, done in zip(sent, finished, strict=True)], to_start


# -- set-up and workers ----------------------------------------------------------------


def setup() -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    database = os.environ.get("WEFT_TASKS_BENCH_DB", "weft_tasks_bench")
    with admin_connection() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {database}")
    import django

    django.setup()
    import redis
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    import benchmarks.tasks_bench.app  # noqa: F401  (the Celery app that sends the messages)


class Worker:
    """One worker subprocess, its output in a log file."""

    def __init__(self, name: str, argv: list[str], log_dir: Path) -> None:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS, "PYTHONPATH": str(REPO_ROOT)}
        self.log_path = log_dir / f"{name}.log"
        self.log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, *argv],
            env=env,
            cwd=REPO_ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def pause(self) -> None:
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.log_path.stem} exited:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.resume()  # a stopped process would not see the SIGTERM
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()


def worker_argv(part: str, args: argparse.Namespace) -> list[str]:
    if part == "weft":
        return ["-m", "django", "weft_worker", "--threads", str(args.threads), "--log-level", "WARNING"]
    if part == "django-tasks-db":
        return [
            *("-m", "django", "db_worker", "--backend", "db", "--queue-name", "default"),
            *("--interval", str(args.poll_interval), "--no-startup-delay", "--no-reload", "-v", "0"),
        ]
    return [
        *("-m", "celery", "-A", "benchmarks.tasks_bench.app", "worker", "-n", "tasks-bench@%h"),
        *("-P", args.celery_pool, "-c", str(args.threads), "-l", "WARNING"),
        *("--without-gossip", "--without-mingle", "--without-heartbeat"),
    ]


def make_part(name: str) -> Part:
    from benchmarks.tasks_bench import tasks

    if name == "weft":
        return FrameworkPart(name, tasks.noop)
    if name == "django-tasks-db":
        return FrameworkPart(name, tasks.noop_db)
    return CeleryPart()


# -- main ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per throughput round (2000)")
    parser.add_argument("--latency-tasks", type=int, default=200, help="tasks per latency round (200)")
    parser.add_argument("--rate", type=float, default=20.0, help="tasks per second in the latency round (20)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians (3)")
    parser.add_argument("--warmup", type=int, default=100, help="untimed tasks per part before timing (100)")
    parser.add_argument("--threads", type=int, default=4, help="weft_worker threads, Celery concurrency (4)")
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=0.1,
        help="db_worker --interval: seconds it sleeps after finding no task (0.1)",
    )
    parser.add_argument("--celery-pool", default="threads", help="Celery worker pool (threads)")
    parser.add_argument("--skip", action="append", choices=PARTS, default=[], help="leave a part out")
    args = parser.parse_args(argv)

    setup()
    from django.conf import settings

    names = [name for name in PARTS if name not in args.skip]
    notes = []
    if "weft" in names and not settings.WEFT_AVAILABLE:
        names.remove("weft")
        notes.append("weft left out: django_weft.tasks (WeftTaskBackend) is not installed")
    log_dir = Path(tempfile.mkdtemp(prefix="weft-tasks-bench-"))
    print(describe_setup(args, log_dir), flush=True)
    for note in notes:
        print(note, flush=True)

    workers = {name: Worker(name, worker_argv(name, args), log_dir) for name in names}
    results: dict[str, dict[str, list[Result]]] = {kind: {} for kind in KINDS}
    try:
        parts = [make_part(name) for name in names]
        for part in parts:
            # The first task also tells that the worker is up (it has a minute to start).
            measure_latency(part, 1, args.rate)
            measure_throughput(part, args.warmup)
        for round_no in range(1, args.rounds + 1):
            for kind in KINDS:
                for part in parts:
                    worker = workers[part.name]
                    worker.check_alive()
                    if kind == "throughput":
                        result = measure_throughput(part, args.tasks)
                    elif kind == "drain":
                        result = measure_drain(part, worker, args.tasks)
                    else:
                        result = measure_latency(part, args.latency_tasks, args.rate)
                    results[kind].setdefault(part.name, []).append(result)
                    print(f"round {round_no} {kind:10} {part.name:15} {result.describe()}", flush=True)
    finally:
        for worker in workers.values():
            worker.stop()

    print(summarise(results, names))
    return 0


def describe_setup(args: argparse.Namespace, log_dir: Path) -> str:
    from django_weft.conf import weft_settings

    with admin_connection() as conn:
        row = conn.execute("SHOW server_version").fetchone()
    packages = ", ".join(
        f"{name} {version(name)}" for name in ("django", "django-tasks", "django-tasks-db", "celery", "redis")
    )
    return (
        f"PostgreSQL {row[0] if row else '?'}; {os.cpu_count()} CPUs; {packages}; "
        f"weft_worker --threads {args.threads}; db_worker --interval {args.poll_interval}; "
        f"WEFT_NOTIFY {weft_settings.NOTIFY}, WEFT_TICK_INTERVAL {weft_settings.TICK_INTERVAL}; "
        f"celery worker -P {args.celery_pool} -c {args.threads}; "
        f"throughput N={args.tasks}, latency N={args.latency_tasks} at {args.rate:g}/s; "
        f"{args.rounds} round(s), warm-up {args.warmup}; logs in {log_dir}"
    )


def summarise(results: dict[str, dict[str, list[Result]]], names: list[str]) -> str:
    """The one summary line: medians over rounds, and the median per-round ratios."""

    def rate(name: str, kind: str = "throughput") -> float:
        return statistics.median(r.per_second for r in results[kind][name])

    def latency(name: str) -> str:
        rounds = results["latency"][name]
        p50 = statistics.median(r.percentile(0.5) for r in rounds)
        p99 = statistics.median(r.percentile(0.99) for r in rounds)
        if rounds[0].to_start is None:
            return f"p50 {p50:.1f} ms, p99 {p99:.1f} ms"
        started = statistics.median(r.percentile(0.5, r.to_start) for r in rounds)
        return f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, started p50 {started:.1f} ms"

    def ratio(other: str, kind: str = "throughput") -> str:
        if "weft" not in names or other not in names:
            return "n/a"
        pairs = zip(results[kind]["weft"], results[kind][other], strict=True)
        return f"{statistics.median(w.per_second / o.per_second for w, o in pairs):.2f}x"

    def part(name: str) -> str:
        return f"{name} {rate(name):.0f} tasks/s ({latency(name)})" if name in names else f"{name} n/a"

    parts = [part(name) for name in PARTS]
    ratios = f"weft/django-tasks-db {ratio('django-tasks-db')}, weft/celery {ratio('celery')}"
    drains = ", ".join(f"{name} {rate(name, 'drain'):.0f}/s" for name in names)
    drain = f"worker alone: {drains} (weft/django-tasks-db {ratio('django-tasks-db', 'drain')})"
    return "tasks: " + " | ".join(parts) + " | " + ratios + " | " + drain


if __name__ == "__main__":
    raise SystemExit(main())
