"""Waking a run with a long history: a run whose history holds H recorded steps (1,000 by
default) is woken by a signal and records its next step; how long that turn takes, at
two history lengths side by side (``--short``, 10 by default, is the baseline).

Each run of ``bench.long_history`` records H inline no-op steps, then loops: it waits for
the signal ``next`` and records one more step. This process starts ``--runs`` such runs
at each length, drives them in-process (one engine, one thread, as ``steps.py`` does)
until they wait, then ``--wakes`` times per run: signals it (untimed) and times
``engine.run_turn(run_id)``: the claim that reads the whole history in one query, the
replay of every recorded step, the signal's consumption, the new step, and the park on
the next wait. The recorded step's own ``finished_at`` minus the turn's start is
reported beside it (the wake's time to the new record, without the park).

Usage (see benchmarks/README.md)::

    .venv/bin/python benchmarks/long_history.py [--history 1000] [--short 10] [--runs 20] [--wakes 5]
                                                [--quick]

Connection settings come from PGHOST, PGPORT, PGUSER and PGPASSWORD (default
127.0.0.1:5432, user postgres). ``weft_history_bench`` is dropped and recreated at every
invocation.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from steps import Server, setup_django, weft_revision

DATABASE = "weft_history_bench"
WORKFLOW = "bench.long_history"


def register() -> None:
    from django_weft import WorkflowContext, activity, workflow

    @activity(name="bench.history_step")
    def history_step(value: Any) -> Any:
        return value

    @workflow(name=WORKFLOW)
    def long_history(ctx: WorkflowContext, steps: int) -> None:
        for index in range(steps):
            ctx.run(history_step, index)
        while True:
            ctx.wait_signal("next")
            ctx.run(history_step, "after")


def prepare(length: int, runs: int) -> list[str]:
    """``runs`` runs, each parked on its wait after ``length`` recorded steps."""
    from django_weft import client
    from django_weft.engine.executor import TurnOutcome
    from django_weft.testing import make_engine

    engine = make_engine()
    ids = [client.start(WORKFLOW, args=[length]).run_id for _ in range(runs)]
    for run_id in ids:
        outcome = engine.run_turn(run_id)
        if outcome != TurnOutcome.PARKED:
            raise RuntimeError(f"run {run_id}: its first turn ended {outcome}, expected parked")
    return ids


def wake(ids: list[str], wakes: int) -> tuple[list[float], list[float]]:
    """Per wake: the turn's seconds, and seconds from the turn's start to the new step's
    recorded end."""
    from django_weft import client
    from django_weft.engine.executor import TurnOutcome
    from django_weft.models import Step
    from django_weft.testing import make_engine

    engine = make_engine()
    turns: list[float] = []
    to_record: list[float] = []
    for _ in range(wakes):
        for run_id in ids:
            handle = client.get_handle(run_id)
            handle.signal("next")
            began_wall = time.time()
            began = time.perf_counter()
            outcome = engine.run_turn(run_id)
            turns.append(time.perf_counter() - began)
            if outcome != TurnOutcome.PARKED:
                raise RuntimeError(f"run {run_id}: a woken turn ended {outcome}, expected parked")
            last = Step.objects.filter(run_id=run_id, kind="activity").order_by("-seq").first()
            assert last is not None and last.finished_at is not None
            to_record.append(last.finished_at.timestamp() - began_wall)
    return turns, to_record


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def describe(length: int, turns: list[float], to_record: list[float]) -> str:
    return (
        f"{length} steps: turn p50 {percentile(turns, 0.5):.1f} ms p99 {percentile(turns, 0.99):.1f} ms, "
        f"to the new record p50 {percentile(to_record, 0.5):.1f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=1000, help="recorded steps of the long runs (1000)")
    parser.add_argument("--short", type=int, default=10, help="recorded steps of the baseline runs (10)")
    parser.add_argument("--runs", type=int, default=20, help="runs at each length (20)")
    parser.add_argument("--wakes", type=int, default=5, help="wakes timed per run (5)")
    parser.add_argument("--quick", action="store_true", help="a CI-sized run: 4 runs at each length, 3 wakes")
    parser.add_argument(
        "--no-gc-freeze", action="store_true", help="leave what was loaded to the garbage collector's walks"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.wakes = 4, 3
    server = Server.from_env()
    setup_django(server, database=DATABASE)
    register()
    # As weft_worker does once it has loaded everything (WEFT_WORKER_GC_FREEZE); here
    # after the migration, so the database stack's modules are among what is frozen.
    from django_weft.runtime import freeze_loaded_objects

    frozen = 0 if args.no_gc_freeze else freeze_loaded_objects()
    print(f"PostgreSQL {server.version()}; {weft_revision()}; {args.runs} runs x {args.wakes} wakes at "
          f"{args.short} and {args.history} recorded steps; {frozen} objects frozen", flush=True)  # fmt: skip
    lengths = (args.short, args.history)
    ids = {length: prepare(length, args.runs) for length in lengths}
    wake(ids[args.short][:2], 1)  # warm-up: the connection, the prepared statements
    results: dict[int, tuple[list[float], list[float]]] = {length: ([], []) for length in lengths}
    for _ in range(args.wakes):  # alternating, so a slow moment is spread over both
        for length in lengths:
            turns, to_record = wake(ids[length], 1)
            results[length][0].extend(turns)
            results[length][1].extend(to_record)
    for length in lengths:
        print(describe(length, *results[length]), flush=True)
    short, long = (statistics.median(results[length][0]) for length in lengths)
    print(
        f"long history: {describe(args.history, *results[args.history])} | "
        f"{describe(args.short, *results[args.short])} | p50 ratio {long / short:.2f}x; "
        f"goal p50 <= 30 ms, p99 <= 60 ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
