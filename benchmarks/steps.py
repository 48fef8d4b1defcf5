"""Steps throughput: django_weft against DBOS Transact and ``pgbench -N -c 1``.

All three run against the same PostgreSQL server, each in a database of its own:

* ``weft_bench``: N runs of a workflow of K inline no-op activities, started with
  ``django_weft.client.start`` and then driven one turn each (every run completes in one
  turn) by a single engine in one thread;
* ``dbos_bench``: the same N x K with DBOS Transact, workflows called one after another
  from one thread;
* ``pgbench_bench``: ``pgbench -N -c 1 -T <seconds>``, the server's one-connection
  ceiling for small write transactions.

Usage (see benchmarks/README.md)::

    .venv/bin/python benchmarks/steps.py [--runs 200] [--steps 20] [--rounds 3] [--warmup 10]
                                         [--prepared] [--skip-dbos] [--pgbench-seconds 10]

Connection settings come from PGHOST, PGPORT, PGUSER and PGPASSWORD (default:
127.0.0.1:5432, user postgres). The benchmark databases are dropped and recreated at the
start of every invocation; never point this script at a database you care about.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import sql

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

WEFT_DB = "weft_bench"
DBOS_DB = "dbos_bench"
PGBENCH_DB = "pgbench_bench"

WORKFLOW_NAME = "bench.steps"
ACTIVITY_NAME = "bench.noop"


# -- connection settings ---------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    host: str
    port: int
    user: str
    password: str

    @classmethod
    def from_env(cls) -> Server:
        return cls(
            host=os.environ.get("PGHOST", "127.0.0.1"),
            port=int(os.environ.get("PGPORT", "5432")),
            user=os.environ.get("PGUSER", "postgres"),
            password=os.environ.get("PGPASSWORD", ""),
        )

    def url(self, database: str) -> str:
        auth = quote(self.user, safe="")
        if self.password:
            auth += ":" + quote(self.password, safe="")
        return f"postgresql://{auth}@{self.host}:{self.port}/{database}"

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url("postgres"), autocommit=True)

    def version(self) -> str:
        with self.admin() as conn:
            row = conn.execute("SHOW server_version").fetchone()
        assert row is not None
        return str(row[0])

    def ensure_database(self, name: str) -> None:
        with self.admin() as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            if exists is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def cpu_seconds(self) -> float | None:
        """The CPU time (user and system) the server's processes have used so far, read
        from ``/proc``: every live ``postgres`` process, plus what the postmaster has
        collected from its children that exited (a pgbench connection's backend). ``None``
        when the server is not on this machine. Differences of two readings are the
        server's CPU over that time (at the kernel's tick, 10 ms per process)."""
        if self.host not in ("127.0.0.1", "localhost", "::1") and not self.host.startswith("/"):
            return None
        processes: dict[int, tuple[int, int, int]] = {}  # pid -> (parent, own ticks, reaped ticks)
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
            except OSError:
                continue  # it exited meanwhile
            if text[text.index("(") + 1 : text.rindex(")")] != "postgres":
                continue
            fields = text[text.rindex(")") + 2 :].split()
            utime, stime, cutime, cstime = (int(value) for value in fields[11:15])
            processes[int(stat.parent.name)] = (int(fields[1]), utime + stime, cutime + cstime)
        if not processes:
            return None
        ticks = sum(own for _, own, _ in processes.values())
        # The postmaster (a postgres process whose parent is not one) has reaped the exited backends.
        ticks += sum(reaped for parent, _, reaped in processes.values() if parent not in processes)
        return ticks / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Rate:
    """``steps`` durable steps recorded in ``seconds``."""

    steps: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.steps / self.seconds

    @property
    def ms_per_step(self) -> float:
        return 1000 * self.seconds / self.steps


def _quiet_gc() -> None:
    """Collect now, so a collection of the set-up garbage does not land in a timed loop."""
    gc.collect()


# -- django_weft -----------------------------------------------------------------------


def setup_django(server: Server, *, prepared: bool = False, database: str = WEFT_DB) -> None:
    import django
    from django.conf import settings

    # A fresh database every invocation, so the schema is exactly what the migrations
    # say now (even if one was edited in place during development).
    server.drop_database(database)
    server.ensure_database(database)
    # Django's defaults: client-side parameter binding and no prepared statements, so every
    # statement is parsed and planned by the server each time. ``prepared`` turns on
    # psycopg's server-side binding and automatic preparation (after 5 executions).
    options: dict[str, Any] = {"server_side_binding": True, "prepare_threshold": 5} if prepared else {}
    settings.configure(
        DEBUG=False,  # DEBUG=True would keep every query in connection.queries
        SECRET_KEY="benchmark-only",
        USE_TZ=True,
        TIME_ZONE="UTC",
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_weft"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": database,
                "USER": server.user,
                "PASSWORD": server.password,
                "HOST": server.host,
                "PORT": str(server.port),
                "CONN_MAX_AGE": None,
                "OPTIONS": options,
            }
        },
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        WEFT_AUTODISCOVER_MODULE=None,
        LOGGING_CONFIG=None,
    )
    django.setup()

    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def register_weft_workflow() -> None:
    from django_weft import WorkflowContext, activity, workflow

    @activity(name=ACTIVITY_NAME)
    def noop(value: int) -> int:
        return value

    @workflow(name=WORKFLOW_NAME)
    def steps(ctx: WorkflowContext, count: int) -> int:
        for i in range(count):
            ctx.run(noop, i)
        return count


def weft_revision() -> str:
    """Which django_weft is measured: its location and, in a git checkout, the commit."""
    import django_weft

    package = Path(django_weft.__file__).resolve().parent
    described = f"django_weft {django_weft.__version__} from {package}"
    try:
        head = subprocess.run(
            ["git", "-C", str(package), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(package), "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return described
    return f"{described} at {head}{' with uncommitted changes' if dirty else ''}"


def start_weft_runs(runs: int, steps: int) -> list[str]:
    from django_weft import client

    return [client.start(WORKFLOW_NAME, args=[steps]).run_id for _ in range(runs)]


def drive_weft_runs(run_ids: list[str]) -> None:
    from django_weft.engine.executor import TurnOutcome
    from django_weft.testing import make_engine

    engine = make_engine()
    for run_id in run_ids:
        outcome = engine.run_turn(run_id)
        if outcome != TurnOutcome.COMPLETED:
            raise RuntimeError(f"run {run_id}: turn ended {outcome}, expected completed in one turn")


def check_weft(run_ids: list[str], steps: int) -> None:
    from django_weft.models import Step, WorkflowRun

    keys = [uuid.UUID(run_id) for run_id in run_ids]
    completed = WorkflowRun.objects.filter(pk__in=keys, status="completed").count()
    recorded = Step.objects.filter(run_id__in=keys, status="completed").count()
    if completed != len(run_ids) or recorded != len(run_ids) * steps:
        raise RuntimeError(
            f"weft: {completed}/{len(run_ids)} runs completed, "
            f"{recorded}/{len(run_ids) * steps} steps recorded"
        )


@dataclass(frozen=True)
class WeftResult:
    drive: Rate
    start_seconds: float
    runs: int

    @property
    def ms_per_start(self) -> float:
        return 1000 * self.start_seconds / self.runs


def setup_weft(server: Server, steps: int, warmup: int, *, prepared: bool, database: str = WEFT_DB) -> None:
    setup_django(server, prepared=prepared, database=database)
    register_weft_workflow()
    if warmup:
        # Opens the connection, fills the caches and plans the statements.
        drive_weft_runs(start_weft_runs(warmup, steps))


def bench_weft(runs: int, steps: int) -> WeftResult:
    _quiet_gc()
    began = time.perf_counter()
    run_ids = start_weft_runs(runs, steps)
    started = time.perf_counter()
    _quiet_gc()
    driving = time.perf_counter()
    drive_weft_runs(run_ids)
    elapsed = time.perf_counter() - driving
    check_weft(run_ids, steps)
    return WeftResult(drive=Rate(runs * steps, elapsed), start_seconds=started - began, runs=runs)


def install_dropping_sdk(sample_ratio: float | None = None) -> None:
    """The OpenTelemetry SDK as an application would set it (docs/how-to/observe.md: a
    ``BatchSpanProcessor``), with an exporter that drops every span: what is measured is
    making the spans and handing them over, not sending them. Every trace is sampled,
    or with ``sample_ratio`` that share of them (``ParentBased(TraceIdRatioBased)``)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Dropping(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    sampler = None if sample_ratio is None else ParentBased(TraceIdRatioBased(sample_ratio))
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(Dropping()))
    trace.set_tracer_provider(provider)


def bench_weft_observed(runs: int, steps: int, *, tracing: bool, metrics: bool) -> WeftResult:
    """:func:`bench_weft` with the tracing observer installed (``WEFT_TRACING``), the
    Prometheus metrics recording (``WEFT_METRICS``), or both."""
    from django_weft import metrics as weft_metrics
    from django_weft import tracing as weft_tracing

    if tracing:
        weft_tracing.install()
    if metrics:
        weft_metrics.enable()
    try:
        return bench_weft(runs, steps)
    finally:
        if metrics:
            weft_metrics.disable()
        if tracing:
            weft_tracing.uninstall()


# -- DBOS Transact ---------------------------------------------------------------------


def require_dbos() -> None:
    try:
        import dbos  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the environment
        raise SystemExit(
            "dbos is not installed: .venv/bin/pip install -r benchmarks/requirements.txt, or pass --skip-dbos"
        ) from None


def bench_dbos(server: Server, runs: int, steps: int, warmup: int) -> Rate:
    from dbos import DBOS, DBOSConfig

    # A fresh system database every round, so every round measures the same state.
    server.drop_database(DBOS_DB)

    @DBOS.step(name=ACTIVITY_NAME)
    def noop(value: int) -> int:
        return value

    @DBOS.workflow(name=WORKFLOW_NAME)
    def steps_workflow(count: int) -> int:
        for i in range(count):
            noop(i)
        return count

    # DBOS >= 3 has no application database: ``database_url`` and
    # ``application_database_url`` are rejected; only the system database is configured.
    # OTLP export is off unless enable_otlp is set, and no Conductor key means no network.
    config: DBOSConfig = {
        "name": "weft-steps-benchmark",
        "system_database_url": server.url(DBOS_DB),
        "log_level": "WARNING",
        "enable_otlp": False,
    }
    DBOS(config=config)
    try:
        DBOS.launch()
        for _ in range(warmup):
            steps_workflow(steps)
        _quiet_gc()
        began = time.perf_counter()
        for _ in range(runs):
            steps_workflow(steps)
        elapsed = time.perf_counter() - began
        _check_dbos(server, runs + warmup, steps)
    finally:
        DBOS.destroy(destroy_registry=True)
    return Rate(runs * steps, elapsed)


def _check_dbos(server: Server, runs: int, steps: int) -> None:
    with psycopg.connect(server.url(DBOS_DB)) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'), "
            "(SELECT count(*) FROM dbos.operation_outputs)"
        ).fetchone()
    assert row is not None
    if row != (runs, runs * steps):
        raise RuntimeError(f"dbos: expected {runs} workflows and {runs * steps} steps, found {row}")


# -- pgbench ---------------------------------------------------------------------------

_TPS = re.compile(
    r"tps = ([0-9.]+) \((?:without initial connection time|excluding connections establishing)\)"
)
_TRANSACTIONS = re.compile(r"number of transactions actually processed: (\d+)")


class PgBench:
    """``pgbench -N -c 1``: per transaction an UPDATE, a SELECT and an INSERT, one commit."""

    def __init__(self, server: Server) -> None:
        pgbench = shutil.which("pgbench")
        if pgbench is None:
            raise SystemExit("pgbench is not on PATH (Debian: apt-get install postgresql-client)")
        self._pgbench = pgbench
        self.server = server
        self._env = {**os.environ, "PGHOST": server.host, "PGPORT": str(server.port), "PGUSER": server.user}
        if server.password:
            self._env["PGPASSWORD"] = server.password
        server.ensure_database(PGBENCH_DB)
        self._run("-i", "-s", "1", "-q")

    def _run(self, *args: str) -> str:
        done = subprocess.run(
            [self._pgbench, *args, PGBENCH_DB], env=self._env, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"pgbench {' '.join(args)} failed:\n{done.stderr}")
        return done.stdout

    def tps(self, seconds: int, clients: int = 1) -> float:
        """Transactions per second of ``clients`` connections (each its own pgbench thread)."""
        return self.measure(seconds, clients)[0]

    def measure(self, seconds: int, clients: int = 1) -> tuple[float, float | None]:
        """Transactions per second of ``clients`` connections, and the server's CPU µs per
        transaction meanwhile (``None`` for a server on another machine)."""
        # A backend whose connection just closed (a worker stopped before, pgbench's own
        # after) exits on its own time: a reading of /proc taken while it exits and the
        # postmaster reaps it can count its CPU twice or not at all. So each reading waits.
        time.sleep(0.5)
        cpu = self.server.cpu_seconds()
        output = self._run("-N", "-c", str(clients), "-j", str(clients), "-T", str(seconds))
        time.sleep(0.5)
        after = self.server.cpu_seconds()
        match, count = _TPS.search(output), _TRANSACTIONS.search(output)
        if match is None or count is None:
            raise RuntimeError(f"could not find the TPS in pgbench's output:\n{output}")
        per = None if cpu is None or after is None else 1e6 * (after - cpu) / int(count.group(1))
        return float(match.group(1)), per


# -- main ------------------------------------------------------------------------------


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def _non_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {number}")
    return number


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=_positive, default=200, help="workflow runs (N), default 200")
    parser.add_argument("--steps", type=_positive, default=20, help="steps per run (K), default 20")
    parser.add_argument(
        "--rounds",
        type=_positive,
        default=3,
        help="alternating rounds of the three parts; medians, default 3",
    )
    parser.add_argument("--warmup", type=_non_negative, default=10, help="untimed runs first, default 10")
    parser.add_argument(
        "--prepared",
        action="store_true",
        help="weft on psycopg server-side binding with prepared statements "
        "(DATABASES OPTIONS server_side_binding=True, prepare_threshold=5) instead of Django's defaults",
    )
    parser.add_argument("--skip-dbos", action="store_true", help="do not run the DBOS Transact part")
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="each round runs weft twice, without and with WEFT_TRACING (the OpenTelemetry SDK "
        "with an exporter that drops every span), and reports the overhead",
    )
    parser.add_argument(
        "--sample-ratio",
        type=float,
        help="with --tracing: sample this share of the traces (ParentBased(TraceIdRatioBased)), "
        "instead of every one",
    )
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="each round runs weft twice, without and with WEFT_METRICS (prometheus_client's "
        "default registry), and reports the overhead; with --tracing, the second part has both",
    )
    parser.add_argument(
        "--weft-database",
        default=WEFT_DB,
        help=f"the database of the weft part (dropped and recreated), default {WEFT_DB}",
    )
    parser.add_argument(
        "--pgbench-seconds", type=_non_negative, default=10, help="pgbench -T duration; 0 skips it"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server = Server.from_env()
    runs, steps, warmup, rounds = args.runs, args.steps, args.warmup, args.rounds
    binding = "prepared statements" if args.prepared else "Django's default parameter binding"
    print(
        f"PostgreSQL {server.version()} at {server.host}:{server.port}; {os.cpu_count()} CPUs; "
        f"N={runs} runs x K={steps} steps, {warmup} warm-up runs, {rounds} round(s); weft on {binding}",
        flush=True,
    )
    if not args.skip_dbos:
        require_dbos()
    setup_weft(server, steps, warmup, prepared=args.prepared, database=args.weft_database)
    if args.tracing:
        install_dropping_sdk(args.sample_ratio)
    print(weft_revision(), flush=True)
    pgbench = PgBench(server) if args.pgbench_seconds else None

    observed = " + ".join(name for name, on in (("traced", args.tracing), ("metrics", args.metrics)) if on)
    weft: list[WeftResult] = []
    traced: list[WeftResult] = []
    dbos: list[Rate] = []
    tps: list[float] = []
    # The three parts alternate round by round, so a slow patch of the machine (shared
    # disks and CPUs drift) weighs on all of them rather than on one.
    for number in range(1, rounds + 1):
        # With an observed part, the two weft parts take turns going first: the second of
        # a pair meets a table the first has just grown, and autovacuum after it.
        observed_first = bool(observed) and number % 2 == 0
        if observed_first:
            traced.append(bench_weft_observed(runs, steps, tracing=args.tracing, metrics=args.metrics))
        result = bench_weft(runs, steps)
        weft.append(result)
        line = [
            f"round {number}/{rounds}: weft {result.drive.per_second:.0f} steps/s "
            f"({result.drive.ms_per_step:.3f} ms/step; start {result.ms_per_start:.2f} ms/run)"
        ]
        if observed:
            if not observed_first:
                traced.append(bench_weft_observed(runs, steps, tracing=args.tracing, metrics=args.metrics))
            line.append(
                f"weft {observed} {traced[-1].drive.per_second:.0f} steps/s "
                f"({traced[-1].drive.ms_per_step:.3f} ms/step; start {traced[-1].ms_per_start:.2f} ms/run)"
            )
        if not args.skip_dbos:
            dbos.append(bench_dbos(server, runs, steps, warmup))
            line.append(f"dbos {dbos[-1].per_second:.0f} steps/s ({dbos[-1].ms_per_step:.3f} ms/step)")
        if pgbench is not None:
            tps.append(pgbench.tps(args.pgbench_seconds))
            line.append(f"pgbench {tps[-1]:.0f} tps")
        print(" | ".join(line), flush=True)

    from django.db import connections

    connections.close_all()
    # Ratios are the medians of the per-round ratios: within a round the parts run minutes
    # apart at most, across rounds the machine may have changed speed.
    weft_rates = [result.drive.per_second for result in weft]
    weft_rate = statistics.median(weft_rates)
    start_ms = statistics.median([result.ms_per_start for result in weft])
    print(f"weft start(): {start_ms:.2f} ms/run (median; not included in the steps figure)", flush=True)
    parts = [f"steps: weft {weft_rate:.0f} steps/s ({1000 / weft_rate:.2f} ms/step)"]
    if dbos:
        dbos_rate = statistics.median([rate.per_second for rate in dbos])
        ratio = statistics.median([w / d.per_second for w, d in zip(weft_rates, dbos, strict=True)])
        parts.append(f"dbos {dbos_rate:.0f} steps/s -> {ratio:.1f}x")
    if tps:
        share = statistics.median([w / t for w, t in zip(weft_rates, tps, strict=True)])
        parts.append(f"pgbench -N -c1 {statistics.median(tps):.0f} tps -> weft at {100 * share:.0f}%")
    if traced:
        traced_rate = statistics.median([result.drive.per_second for result in traced])
        pairs = zip(weft_rates, traced, strict=True)
        cost = statistics.median([1 - t.drive.per_second / w for w, t in pairs])
        traced_start = statistics.median([result.ms_per_start for result in traced])
        parts.append(
            f"{observed} {traced_rate:.0f} steps/s -> {100 * cost:+.1f}% overhead "
            f"(start {traced_start:.2f} ms/run vs {start_ms:.2f})"
        )
    print(" | ".join(parts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
