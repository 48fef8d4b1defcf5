"""The chaos harness: private servers, worker processes, the workload, the faults, the check.

``python -m tests.chaos --seconds 120 --seed 7`` (or ``scripts/chaos --minutes 30``):

1. a PostgreSQL cluster and a Redis server of the run's own (tests/support/services.py);
2. Celery workers (prefork) with beat on that Redis, and ``weft_worker`` processes, side
   by side on that database, each in a process group of its own;
3. for the run's length, the driver plans and starts orders (and each order's run of the
   concurrency-limited workflow) and sends each its numbered signals one after the
   other, while an every-second schedule fires, and faults are
   injected at random (seeded): SIGKILL of a worker's group (a replacement is started),
   SIGSTOP of a worker past its lease then SIGCONT (a zombie owner, deposed while it
   slept), PostgreSQL restarted twice (once cleanly, once crashed), the broker stopped
   for 10 s and started empty;
4. the faults stop, the schedule is paused, every run is waited for, and the invariants
   (tests/chaos/invariants.py) are checked against the database.

Every fault is logged with its time. Every process and server started here is stopped on
the way out, also on a failure or Ctrl-C. Exits 0 when every invariant holds.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.support.processes import REPO, CeleryCluster, CeleryProcess, WorkerProcess
from tests.support.services import PrivatePostgres, PrivateRedis

T = TypeVar("T")

LEASE_TTL = 3.0  # tests/chaos/settings.py
TAKEOVER_GRACE = 0.5
CELERY_WORKERS = 2
WEFT_WORKERS = 2
ORDERS_PER_SECOND = 1.0
SIGNALS_PER_ORDER = 3
BROKER_DOWN_FOR = 10.0


@dataclass
class Figures:
    kills: int = 0
    zombies: int = 0
    zombie_runs: int = 0
    postgres_restarts: int = 0
    broker_stops: int = 0
    replacements: int = 0
    driver_retries: int = 0
    by_fault: Counter[str] = field(default_factory=Counter)


class Log:
    """Timestamped lines to the terminal and to ``chaos.log`` in the run's folder."""

    def __init__(self, path: Path) -> None:
        self.started = time.monotonic()
        self._file = path.open("a", buffering=1)
        self._lock = threading.Lock()

    def __call__(self, message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} +{time.monotonic() - self.started:6.1f}s {message}"
        with self._lock:
            print(line, flush=True)
            self._file.write(line + "\n")

    def close(self) -> None:
        self._file.close()


class Chaos:
    """One chaos run. Use as a context manager: leaving it stops everything it started."""

    def __init__(self, seconds: float, seed: int, root: Path, keep: bool) -> None:
        self.seconds = seconds
        self.seed = seed
        self.random = random.Random(seed)
        self.root = root
        self.keep = keep
        self.log = Log(root / "chaos.log")
        self.figures = Figures()
        self.postgres: PrivatePostgres | None = None
        self.redis: PrivateRedis | None = None
        self.cluster: CeleryCluster | None = None
        self.weft_workers: list[WorkerProcess] = []
        self.stop_faults = threading.Event()
        self.fault_error: BaseException | None = None
        self.passed = False

    # -- the servers and the processes -----------------------------------------------------

    def __enter__(self) -> Chaos:
        atexit.register(self.close)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start_servers(self) -> None:
        # Acknowledged commits survive the crash: the invariants count every one of them.
        self.postgres = PrivatePostgres(keep_commits=True)
        self.postgres.start()
        self.postgres.create_database("chaos")
        self.redis = PrivateRedis(self.root / "redis")
        self.redis.start()
        os.environ.update(self.env())
        os.environ["WEFT_LOG_LEVEL"] = "WARNING"  # this process's own log: the workers' are in files
        self.log(
            f"PostgreSQL on port {self.postgres.port}, Redis on port {self.redis.port}, folder {self.root}"
        )

    def env(self) -> dict[str, str]:
        assert self.postgres is not None and self.redis is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        env.update(
            DJANGO_SETTINGS_MODULE="tests.chaos.settings",
            PYTHONPATH=str(REPO),
            WEFT_TEST_DB="postgres",
            WEFT_TEST_CELERY="1",
            WEFT_CHAOS_PG_PORT=str(self.postgres.port),
            WEFT_CHAOS_BROKER_URL=self.redis.url,
            WEFT_LOG_LEVEL="INFO",
        )
        env.pop("WEFT_FAULTS", None)
        return env

    def start_workers(self) -> None:
        assert self.redis is not None
        self.cluster = CeleryCluster(self.root, self.redis.url, self.env())
        celery = [self.cluster.worker(concurrency=2, queues="celery,chaos") for _ in range(CELERY_WORKERS)]
        self.cluster.beat()
        for _ in range(WEFT_WORKERS):
            self.start_weft_worker()
        for process in celery:
            process.wait_ready(90)
        self.log(f"{CELERY_WORKERS} Celery workers, a beat and {WEFT_WORKERS} weft_worker processes started")

    def start_weft_worker(self) -> WorkerProcess:
        worker = WorkerProcess(self.root, len(self.weft_workers), self.env(), ["--threads", "2"])
        self.weft_workers.append(worker)
        return worker

    def live_workers(self) -> list[tuple[str, WorkerProcess | CeleryProcess]]:
        """The worker processes alive now, by kind (beat is left out: it owns no runs)."""
        found: list[tuple[str, WorkerProcess | CeleryProcess]] = [
            ("weft_worker", w) for w in self.weft_workers if w.alive()
        ]
        if self.cluster is not None:
            found += [
                ("celery", p) for p in self.cluster.processes if p.alive() and "beat" not in p.log_path.name
            ]
        return found

    def close(self) -> None:
        """Stop every process and server this run started (idempotent)."""
        self.stop_faults.set()
        for worker in self.weft_workers:
            with contextlib.suppress(Exception):
                worker.signal_group(signal.SIGCONT)
                worker.stop()
        self.weft_workers = []
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.stop()
            self.cluster = None
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        if self.redis is not None:
            with contextlib.suppress(Exception):
                self.redis.stop()
            self.redis = None
        if self.postgres is not None:
            with contextlib.suppress(Exception):
                self.postgres.destroy()
            self.postgres = None
        if self.passed and not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- the faults ---------------------------------------------------------------------------

    def fault_plan(self) -> list[tuple[float, str]]:
        """The fixed faults (two PostgreSQL restarts, one broker outage) at their offsets."""
        return [
            (self.seconds * 0.3, "postgres_restart"),
            (self.seconds * 0.5, "broker_outage"),
            (self.seconds * 0.7, "postgres_crash"),
        ]

    def inject_faults(self) -> None:
        try:
            self._inject_faults()
        except BaseException as exc:  # reported by the driver, which then fails the run
            self.fault_error = exc
            self.log(f"fault thread failed: {exc!r}")

    def _inject_faults(self) -> None:
        start = time.monotonic()
        fixed = self.fault_plan()
        rotation, turn = ["kill", "zombie"], self.random.randrange(2)
        while not self.stop_faults.wait(self.random.uniform(3.0, 8.0)):
            elapsed = time.monotonic() - start
            if elapsed >= self.seconds:
                return
            if fixed and fixed[0][0] <= elapsed:
                _, name = fixed.pop(0)
            else:
                name = rotation[turn % len(rotation)]
                turn += 1
            getattr(self, f"fault_{name}")()

    def choose_victim(self) -> tuple[str, WorkerProcess | CeleryProcess] | None:
        """A live worker process at random, preferring one that owns runs right now."""
        candidates = self.live_workers()
        owning = [(kind, process) for kind, process in candidates if self.runs_owned_by(process) > 0]
        return self.random.choice(owning or candidates) if candidates else None

    def fault_kill(self) -> None:
        chosen = self.choose_victim()
        if chosen is None:
            return
        kind, victim = chosen
        held = self.runs_owned_by(victim)
        victim.kill()
        self.figures.kills += 1
        self.figures.by_fault[f"kill {kind}"] += 1
        self.log(f"FAULT SIGKILL {kind} group {victim.pid} (owned {held} runs); starting a replacement")
        self.replace(kind)

    def replace(self, kind: str) -> None:
        self.figures.replacements += 1
        if kind == "weft_worker":
            self.start_weft_worker()
        else:
            assert self.cluster is not None
            self.cluster.worker(concurrency=2, queues="celery,chaos")

    def fault_zombie(self) -> None:
        chosen = self.choose_victim()
        if chosen is None:
            return
        kind, victim = chosen
        before = self.owned_runs(victim)
        pause = LEASE_TTL + TAKEOVER_GRACE + self.random.uniform(1.5, 3.0)
        victim.signal_group(signal.SIGSTOP)
        self.figures.zombies += 1
        self.log(f"FAULT SIGSTOP {kind} group {victim.pid} for {pause:.1f}s (past its {LEASE_TTL:g}s lease), "
                 f"owning {len(before)} runs")  # fmt: skip
        # Not cut short when the faulty phase ends: the zombie must outlive its lease.
        time.sleep(pause)
        after = self.owned_runs(victim)
        deposed = len(before) - len(before & after) if before is not None and after is not None else 0
        victim.signal_group(signal.SIGCONT)
        self.figures.zombie_runs += deposed
        self.log(
            f"FAULT SIGCONT {kind} group {victim.pid}: {deposed} of its runs were taken over while it slept"
        )

    def fault_postgres_restart(self) -> None:
        assert self.postgres is not None
        self.log("FAULT PostgreSQL restart (fast shutdown)")
        self.postgres.restart("fast")
        self.figures.postgres_restarts += 1
        self.log("PostgreSQL is back")

    def fault_postgres_crash(self) -> None:
        assert self.postgres is not None
        self.log("FAULT PostgreSQL crash (immediate shutdown) and start, with crash recovery")
        self.postgres.crash()
        time.sleep(2)
        self.postgres.start()
        self.figures.postgres_restarts += 1
        self.log("PostgreSQL is back")

    def fault_broker_outage(self) -> None:
        assert self.redis is not None
        self.log(f"FAULT broker stopped for {BROKER_DOWN_FOR:g}s (its queued messages are lost)")
        self.redis.restart(down_for=BROKER_DOWN_FOR)
        self.figures.broker_stops += 1
        self.log("broker is back, empty")

    def owned_runs(self, process: WorkerProcess | CeleryProcess) -> set[str] | None:
        """(run, epoch) of the runs a worker process (or its pool) owns now; None if the
        database cannot be read at the moment."""
        from django.db import connection

        from django_weft.models import WorkflowRun

        pids = {str(process.pid)}
        if isinstance(process, CeleryProcess):
            pids |= {str(pid) for pid in process.pool_pids()}
        try:
            rows = WorkflowRun.objects.filter(owner_id__isnull=False).values_list(
                "pk", "owner_id", "owner_epoch"
            )
            return {f"{pk}@{epoch}" for pk, owner, epoch in rows if owner.split(":")[1] in pids}
        except Exception:
            connection.close()
            return None

    def runs_owned_by(self, process: WorkerProcess | CeleryProcess) -> int:
        owned = self.owned_runs(process)
        return len(owned) if owned is not None else -1

    # -- the workload -------------------------------------------------------------------------

    def retrying(self, what: str, action: Callable[[], T]) -> T | None:
        """``action()``, or None after a database or broker error (logged; the caller
        tries again later). The connection is closed so the next try opens a new one."""
        done, value = self.attempt(what, action)
        return value if done else None

    def until_done(self, what: str, action: Callable[[], T], timeout: float) -> T:
        """``action()``, tried again after each database or broker error for ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            done, value = self.attempt(what, action)
            if done:
                return value  # type: ignore[return-value]
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: still failing after {timeout:g}s")

    def attempt(self, what: str, action: Callable[[], T]) -> tuple[bool, T | None]:
        from django.db import connection

        try:
            return True, action()
        except Exception as exc:
            self.figures.driver_retries += 1
            if self.figures.driver_retries % 20 == 1:
                self.log(f"driver: {what} failed ({type(exc).__name__}: {str(exc)[:120]}); trying again")
            with contextlib.suppress(Exception):
                connection.close()
            time.sleep(0.3)
            return False, None

    def create_schedule(self) -> None:
        from django_weft import client

        from .invariants import SCHEDULE_EVERY, SCHEDULE_ID
        from .workflows import TICK

        client.create_schedule(
            SCHEDULE_ID, TICK, every=SCHEDULE_EVERY, overlap="allow_all", catchup_window=3600
        )

    def drive(self) -> None:
        """Plan and start orders and send their signals for the run's length."""
        from .models import PlannedOrder

        started: dict[str, str] = {}  # key -> run id
        limited: set[str] = set()  # keys whose limited run was started
        sent: Counter[str] = Counter()
        planned: list[str] = []
        deadline = time.monotonic() + self.seconds
        next_order = time.monotonic()
        while time.monotonic() < deadline:
            if self.fault_error is not None:
                raise RuntimeError("the fault thread failed") from self.fault_error
            if time.monotonic() >= next_order:
                key = f"order-{len(planned):05d}"
                planned_row = self.retrying(
                    "planning an order",
                    lambda key=key: PlannedOrder.objects.get_or_create(
                        key=key, defaults={"signals": SIGNALS_PER_ORDER}
                    ),
                )
                if planned_row is not None:
                    planned.append(key)
                    next_order += 1 / ORDERS_PER_SECOND
            self.send_pending(planned, started, limited, sent)
            time.sleep(0.05)
        self.log(f"driver: {len(planned)} orders planned; finishing their starts and signals")
        finish_by = time.monotonic() + 60
        while any(sent[key] < SIGNALS_PER_ORDER or key not in limited for key in planned):
            if time.monotonic() > finish_by:
                raise RuntimeError("the driver could not finish its starts and signals within 60 s")
            self.send_pending(planned, started, limited, sent)
            time.sleep(0.05)

    def send_pending(
        self, planned: list[str], started: dict[str, str], limited: set[str], sent: Counter[str]
    ) -> None:
        """Start the planned orders (and each order's limited run) not started yet, and send
        each started order its next signal (one per order per pass, so each order's
        signals go out in order). A start is sent again until it answers: its workflow id
        makes a repeated start return the run the first one created."""
        from django_weft import client

        from .workflows import LIMITED, ORDER, SIGNAL, lane_for, limited_id

        for key in planned:
            if key not in limited:
                handle = self.retrying(
                    f"starting {key}'s limited run",
                    lambda key=key: client.start(LIMITED, args=[key, lane_for(key)], id=limited_id(key)),
                )
                if handle is not None:
                    limited.add(key)
            if key not in started:
                handle = self.retrying(
                    f"starting {key}",
                    lambda key=key: client.start(ORDER, args=[key, SIGNALS_PER_ORDER], id=key),
                )
                if handle is not None:
                    started[key] = handle.run_id
                continue
            number = sent[key]
            if number >= SIGNALS_PER_ORDER:
                continue
            # A repeated signal_id stores nothing new: a send whose answer was lost in a
            # restart is sent again safely.
            accepted = self.retrying(
                f"signal {number} to {key}",
                lambda key=key, number=number: client.get_handle(started[key]).signal(
                    SIGNAL, number, signal_id=f"{key}:{number}"
                ),
            )
            if accepted is not None:
                sent[key] += 1

    def settle(self, timeout: float) -> None:
        """Pause the schedule, then wait until every run has finished."""
        from django_weft import client
        from django_weft.models import WorkflowRun

        from .invariants import SCHEDULE_ID

        deadline = time.monotonic() + timeout
        self.until_done(
            "pausing the schedule",
            lambda: client.get_schedule_handle(SCHEDULE_ID).pause("chaos run over"),
            30,
        )
        active = ["pending", "running", "waiting", "suspended"]
        while True:
            left = self.retrying(
                "counting open runs", lambda: WorkflowRun.objects.filter(status__in=active).count()
            )
            if left == 0:
                return
            if time.monotonic() > deadline:
                self.log(f"{left} runs still open after {timeout:g}s of settling")
                return
            time.sleep(0.5)

    def run(self) -> bool:
        self.log(f"chaos run: {self.seconds:g}s of faults, seed {self.seed}")
        self.start_servers()
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        self.until_done("creating the schedule", self.create_schedule, 30)
        self.start_workers()
        faults = threading.Thread(target=self.inject_faults, name="faults", daemon=True)
        faults.start()
        try:
            self.drive()
        finally:
            self.stop_faults.set()
            faults.join()
        for _, process in self.live_workers():
            process.signal_group(signal.SIGCONT)
        if not any(kind == "weft_worker" for kind, _ in self.live_workers()):
            self.start_weft_worker()
        self.log("faults stopped; settling")
        settled_at = time.monotonic()
        self.settle(timeout=max(90.0, self.seconds / 2))
        self.log(f"settled in {time.monotonic() - settled_at:.1f}s; checking the invariants")
        from .invariants import check_all

        report = self.until_done("checking the invariants", check_all, 60)
        for line in report.lines():
            self.log(line)
        f = self.figures
        self.log(
            f"chaos {'PASSED' if report.ok else 'FAILED'}: seed={self.seed} seconds={self.seconds:g} "
            f"orders={report.figures['orders']} runs={report.figures['runs']} "
            f"steps={report.figures['steps']} "
            f"kills={f.kills} zombies={f.zombies} zombie_runs={f.zombie_runs} "
            f"multi_epoch_runs={report.figures['multi_epoch_runs']} postgres_restarts={f.postgres_restarts} "
            f"broker_stops={f.broker_stops} driver_retries={f.driver_retries} | {report.counts()}"
        )
        self.passed = report.ok
        if not report.ok:
            self.log(f"logs kept in {self.root}")
        return report.ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--seconds", type=float, help="length of the faulty phase in seconds (default 120)")
    length.add_argument("--minutes", type=float, help="length of the faulty phase in minutes")
    parser.add_argument(
        "--seed", type=int, help="the random seed of the faults (default: a random one, printed)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the run's folder (logs) even when it passes"
    )
    args = parser.parse_args(argv)
    seconds = args.minutes * 60 if args.minutes is not None else (args.seconds or 120.0)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    root = Path(tempfile.mkdtemp(prefix="weft-chaos-"))

    def interrupted(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupted)
    with Chaos(seconds, seed, root, keep=args.keep) as chaos:
        try:
            return 0 if chaos.run() else 1
        except KeyboardInterrupt:
            chaos.log(f"interrupted; stopping everything (logs in {root})")
            return 130
        except Exception as exc:
            chaos.log(f"chaos run ERROR: {type(exc).__name__}: {exc} (logs in {root})")
            raise


if __name__ == "__main__":
    sys.exit(main())
