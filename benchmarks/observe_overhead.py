"""What the observation points and the Prometheus metrics cost the steps throughput
(``steps.py``'s workload: runs of K inline no-op activities, each completed in one turn
by one engine in one thread), on PostgreSQL.

Variants, each in a process of its own so that one's imports cannot help another:

* ``baseline`` (with ``--baseline PATH``): the django_weft of another checkout, e.g. the
  commit before the observation points, ``prometheus_client`` hidden;
* ``bare``: this checkout with ``prometheus_client`` hidden (the ``prometheus`` extra not
  installed) and no observer: every point is a test of an empty tuple;
* ``metrics``: this checkout with the metrics on (``django_weft.metrics.enable()``, as
  ``WEFT_METRICS = True`` does): every turn and attempt updates counters and histograms;
* ``traced`` and ``observed`` (with ``--tracing``): tracing on (``WEFT_TRACING``; the
  OpenTelemetry SDK as docs/how-to/observe.md wires it, a ``BatchSpanProcessor`` and an
  exporter that drops every span), and tracing with the metrics;
* ``own`` (with ``--tracing``): tracing and metrics on with no tracer provider set, so
  every span is the API's no-op one: django_weft's own share of ``observed`` (its
  observation points, its observers, the context made current). What ``observed`` adds
  to it is the SDK's spans and what a real span brings with it: the trace context each
  start stores and each turn reads back.

``--instructions`` counts instead of timing: each variant runs under Valgrind's
``callgrind`` twice, driving 10 and then ``--runs`` runs (the same runs started in both),
and the difference of the instructions the process executed, divided by the steps,
is the instructions per step. The count is the same from one invocation to the next
within about 1 %, where the timings of a shared machine move by tens of
percent; it says what work a variant adds, not what that work costs in time (a step
waits for the database too, and code that evicts the engine's from the CPU's caches
slows the engine down).

Each round runs every variant once, in a rotating order, and each process warms up before
it is timed. The summary line gives, for each variant, the median steps/s and the median CPU time of
this process per step, and against the variant before it the median of the per-round
ratios of steps/s and the difference of CPU time. Steps/s is bound by the database's
commit latency, which drifts on a shared server; the CPU time per step is what the
observers add and is the steadier figure.

Usage::

    .venv/bin/python benchmarks/observe_overhead.py [--runs 200] [--steps 20] [--rounds 5]
                                                    [--baseline ../checkout-before]

Connection settings come from PGHOST, PGPORT, PGUSER and PGPASSWORD (default
127.0.0.1:5432, user postgres). ``weft_observe_bench`` (and ``weft_observe_base``) are
dropped and recreated at every invocation.
"""

from __future__ import annotations

import argparse
import importlib.abc
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DATABASES = {
    "baseline": "weft_observe_base",
    "bare": "weft_observe_bench",
    "metrics": "weft_observe_bench",
    "traced": "weft_observe_bench",
    "observed": "weft_observe_bench",
    "own": "weft_observe_bench",
}
USES_PROMETHEUS = {"metrics", "traced", "observed", "own"}
"""The variants that may import prometheus_client (the others run as if it were not
installed)."""
WITH_METRICS = {"metrics", "observed", "own"}
TRACED = {"traced", "observed", "own"}
"""The variants with the tracing observer installed."""
WITH_SDK = {"traced", "observed"}
"""The variants whose tracer provider is the OpenTelemetry SDK's (``own`` sets none: the
API's no-op tracer)."""
DRIVEN_FIRST = 10
"""With ``--instructions``: the runs driven by the first of the two processes counted."""


class _Hidden(importlib.abc.MetaPathFinder):
    """Answers as Python does for a package that is not installed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.partition(".")[0] == "prometheus_client":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def child_in_memory(variant: str, runs: int, steps: int, warmup: int, drive_only: int | None) -> None:
    """The same workload on the engine's in-memory store: no database, so the steps/s is
    the engine's own CPU cost and an observer's share of it shows in full."""
    import django_weft
    from django_weft.engine.executor import TurnOutcome
    from django_weft.engine.registry import Registry, Workflow
    from django_weft.engine.testing.memory_store import memory_engine

    assert Path(django_weft.__file__).resolve().parent.parent in {REPO_ROOT, *map(Path, sys.path[:1])}
    _observe(variant)

    def noop(value: int) -> int:
        return value

    def workload(ctx: Any, count: int) -> int:
        for i in range(count):
            ctx.run(noop, i)
        return count

    workflows = Registry()
    workflows.workflows["bench.steps"] = Workflow(fn=workload, name="bench.steps")
    engine, store, _ = memory_engine(workflows)

    def drive(count: int, driven: int | None = None) -> float:
        ids = [store.start("bench.steps", steps) for _ in range(count)]
        began = time.perf_counter()
        for run_id in ids[:driven]:
            assert engine.run_turn(run_id) == TurnOutcome.COMPLETED
        return time.perf_counter() - began

    drive(warmup)
    if drive_only is not None:
        drive(runs, drive_only)
        return
    seconds = drive(runs)
    print(runs * steps / seconds, 1_000_000 * seconds / (runs * steps))


def _observe(variant: str) -> None:
    """Turn on what ``variant`` observes with."""
    if variant in WITH_METRICS:
        from django_weft import metrics

        metrics.enable()
    if variant in TRACED:
        from django_weft import tracing

        if variant in WITH_SDK:
            from benchmarks.steps import install_dropping_sdk

            install_dropping_sdk()
        tracing.install()


def child(
    variant: str, runs: int, steps: int, warmup: int, code: str | None, memory: bool, drive_only: int | None
) -> None:
    """One variant's timing, printed as its last line: steps per second and CPU µs per step.
    With ``drive_only``: ``runs`` runs started, that many of them driven, nothing timed
    (the process is counted from outside)."""
    if variant not in USES_PROMETHEUS:
        sys.meta_path.insert(0, _Hidden())
    sys.path.insert(0, str(REPO_ROOT))
    if code is not None:
        sys.path.insert(0, code)
    if memory:
        child_in_memory(variant, runs, steps, warmup, drive_only)
        return
    from benchmarks import common
    from benchmarks import steps as workload

    common.setup_django(DATABASES[variant], urlconf="benchmarks.api_urls", keep=True)
    import django_weft

    assert Path(django_weft.__file__).resolve().parent.parent == Path(code or REPO_ROOT).resolve()
    _observe(variant)
    workload.register_weft_workflow()
    workload.drive_weft_runs(workload.start_weft_runs(warmup, steps))
    run_ids = workload.start_weft_runs(runs, steps)
    if drive_only is not None:
        workload.drive_weft_runs(run_ids[:drive_only])
        # The same check in both processes counted, so it is not counted as steps.
        workload.check_weft(run_ids[:DRIVEN_FIRST], steps)
        return
    workload._quiet_gc()
    began, cpu = time.perf_counter(), time.process_time()
    workload.drive_weft_runs(run_ids)
    seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - cpu
    workload.check_weft(run_ids, steps)
    print(runs * steps / seconds, 1_000_000 * cpu_seconds / (runs * steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--baseline", help="a checkout whose django_weft is the baseline")
    parser.add_argument(
        "--in-memory", action="store_true", help="the engine on its in-memory store: no database, CPU only"
    )
    parser.add_argument(
        "--tracing", action="store_true", help="also the variants traced and observed (tracing and metrics)"
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count the instructions per step under Valgrind (callgrind) instead of timing: "
        "one round, the same count (within about 1 %) at every invocation",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--code", help=argparse.SUPPRESS)
    parser.add_argument("--drive", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        child(options.child, options.runs, options.steps, options.warmup, options.code, options.in_memory,
              options.drive)  # fmt: skip
        return
    if options.instructions and options.runs <= DRIVEN_FIRST:
        parser.error(f"--instructions counts the difference of {DRIVEN_FIRST} runs and --runs: give more")
    if options.instructions and shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs Valgrind: apt-get install valgrind")
    sys.path.insert(0, str(REPO_ROOT))
    if not options.in_memory:
        _drop_databases()
    variants = ["baseline", "bare", "metrics"] if options.baseline else ["bare", "metrics"]
    if options.tracing:
        variants += ["traced", "observed", "own"]
    if options.instructions:
        count_instructions(options, variants)
        return
    rates: dict[str, list[float]] = {variant: [] for variant in variants}
    cpu: dict[str, list[float]] = {variant: [] for variant in variants}
    env = _child_env()
    for round_number in range(options.rounds):
        order = variants[round_number % len(variants) :] + variants[: round_number % len(variants)]
        for variant in order:
            argv = [sys.executable, *_child_argv(options, variant)]
            done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{variant}: {done.stderr}")
            rate, micros = done.stdout.strip().splitlines()[-1].split()
            rates[variant].append(float(rate))
            cpu[variant].append(float(micros))
        print(f"round {round_number + 1}: " + ", ".join(
            f"{v} {rates[v][-1]:.0f} steps/s ({cpu[v][-1]:.0f} µs CPU/step)" for v in variants))  # fmt: skip

    def ratio(variant: str, to: str) -> float:
        return statistics.median(a / b for a, b in zip(rates[variant], rates[to], strict=True))

    def figures(variant: str, to: str | None) -> str:
        micros = statistics.median(cpu[variant])
        text = f"{statistics.median(rates[variant]):.0f} steps/s, {micros:.0f} µs CPU/step"
        if to is None:
            return text
        extra = micros - statistics.median(cpu[to])
        return f"{text} ({ratio(variant, to) - 1:+.1%} steps/s, {extra:+.0f} µs CPU/step vs {to})"

    parts = [f"{LABELS[v]} {figures(v, _compared_to(v, variants))}" for v in variants]
    where = ", in memory" if options.in_memory else ""
    print(
        f"observe overhead ({options.runs} runs x {options.steps} steps, {options.rounds} rounds{where}): "
        + " | ".join(parts)
    )


LABELS = {
    "baseline": "baseline",
    "bare": "no observer, prometheus_client not installed",
    "metrics": "metrics on",
    "traced": "tracing on",
    "observed": "tracing and metrics on",
    "own": "the same without the SDK",
}


def count_instructions(options: argparse.Namespace, variants: list[str]) -> None:
    """Each variant's instructions per step: two processes under callgrind, driving
    ``DRIVEN_FIRST`` and ``--runs`` of the same ``--runs`` runs started (side by side in
    memory, one after the other on PostgreSQL)."""
    # The same hashes in every process: dict and set layouts, so the same work.
    env = {**_child_env(), "PYTHONHASHSEED": "0"}

    def counted(variant: str, driven: int, *, fresh: bool = False) -> subprocess.Popen[str]:
        if fresh:
            _drop_databases()
        argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                *_child_argv(options, variant), "--drive", str(driven)]  # fmt: skip
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def instructions(process: subprocess.Popen[str], variant: str) -> int:
        _, err = process.communicate()
        found = re.search(r"Collected\s*:\s*(\d+)", err)
        if process.returncode != 0 or found is None:
            raise SystemExit(f"{variant}: {err[-2000:]}")
        return int(found.group(1))

    per_step: dict[str, float] = {}
    for variant in variants:
        if options.in_memory:
            # No database: the two processes run side by side.
            first, second = counted(variant, DRIVEN_FIRST), counted(variant, options.runs)
            counts = instructions(first, variant), instructions(second, variant)
        else:
            # One after the other, each on a database made afresh: both meet the same tables.
            counts = tuple(
                instructions(counted(variant, driven, fresh=True), variant)
                for driven in (DRIVEN_FIRST, options.runs)
            )
        per_step[variant] = (counts[1] - counts[0]) / ((options.runs - DRIVEN_FIRST) * options.steps)
        print(f"{variant}: {per_step[variant]:,.0f} instructions/step", flush=True)

    def figure(variant: str, to: str | None) -> str:
        text = f"{per_step[variant] / 1000:.1f}k"
        if to is None:
            return text
        return f"{text} ({per_step[variant] / per_step[to] - 1:+.1%} vs {to})"

    parts = [f"{LABELS[v]} {figure(v, _compared_to(v, variants))}" for v in variants]
    where = ", in memory" if options.in_memory else ""
    runs = f"{options.runs} - {DRIVEN_FIRST} runs x {options.steps} steps{where}"
    print(f"observe instructions per step ({runs}): " + " | ".join(parts))


def _compared_to(variant: str, variants: list[str]) -> str | None:
    """The variant ``variant``'s figures are given against: ``bare`` for the observed
    ones, the baseline (when measured) for ``bare``."""
    if variant == "baseline" or (variant == "bare" and "baseline" not in variants):
        return None
    return "baseline" if variant == "bare" else "bare"


def _child_argv(options: argparse.Namespace, variant: str) -> list[str]:
    """This script's arguments for a child timing or counting ``variant``."""
    argv = [__file__, "--child", variant, "--runs", str(options.runs), "--steps", str(options.steps),
            "--warmup", str(options.warmup)]  # fmt: skip
    if variant == "baseline":
        argv += ["--code", str(Path(options.baseline).resolve())]
    if options.in_memory:
        argv.append("--in-memory")
    return argv


def _child_env() -> dict[str, str]:
    """This environment without what would point a child at another project or checkout."""
    dropped = ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")
    return {key: value for key, value in os.environ.items() if key not in dropped}


def _drop_databases() -> None:
    from benchmarks import common

    with common.admin_connection() as conn:
        for database in set(DATABASES.values()):
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


if __name__ == "__main__":
    main()
