"""``weft_replay`` over many stored runs: time per run, and memory that stays flat with
the number of runs because they are read in keyset batches.

``weft_replay_bench`` is filled with ``--runs`` runs of a workflow of ``--steps`` inline
steps, recorded for real by the engine (one thread), half of them completed and half
parked on a sleep after their steps. Then, for ``--rounds`` rounds:

- reading alone: iterate over the history documents of every run
  (``runtime.stored_documents``), the database and decoding part of a replay;
- replaying: ``runtime.replay_runs`` over every run (reading plus the replay of each
  history against the workflow code), every one of them checked OK;
- peak memory of the replay (``tracemalloc``, a separate pass) at ``--batch`` and at ten
  times ``--batch`` runs per query.

The summary line gives the medians: replay time, runs per second, the replay's cost
relative to reading alone, and the peak memory at both batch sizes.

Usage::

    .venv/bin/python benchmarks/replay.py [--runs 1000] [--steps 20] [--batch 100] [--rounds 3]

Connection settings come from PGHOST, PGPORT, PGUSER and PGPASSWORD (default
127.0.0.1:5432, user postgres). ``weft_replay_bench`` is dropped and recreated at every
invocation.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import api as api_bench  # noqa: E402 - after the path is set

DB = "weft_replay_bench"


def setup_django(steps: int) -> None:
    api_bench.DB = DB
    api_bench.setup_django()

    from django_weft import WorkflowContext, activity, workflow

    @activity(name="bench.step")
    def step(i: int) -> int:
        return i

    @workflow(name="bench.steps")
    def steps_workflow(ctx: WorkflowContext, n: int, park: bool) -> int:
        total = sum(ctx.run(step, i) for i in range(steps))
        if park:
            ctx.sleep("1d")
        return total


def fill(runs: int) -> float:
    """Record ``runs`` runs for real; returns the seconds it took."""
    from django_weft import client
    from django_weft.testing import make_engine

    engine = make_engine("bench-fill")
    started = time.perf_counter()
    for n in range(runs):
        handle = client.start("bench.steps", args=[n, n % 2 == 1])
        engine.run_turn(handle.run_id)
    return time.perf_counter() - started


def read_all(batch: int) -> int:
    from django_weft import runtime

    return sum(1 for _ in runtime.stored_documents(runtime.RunSelection(), batch=batch))


def replay_all(batch: int) -> Any:
    from django_weft import runtime

    summary = runtime.ReplaySummary()
    for replay in runtime.replay_runs(runtime.RunSelection(), batch=batch):
        summary.add(replay)
    return summary


def timed(fn: Any, *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    value = fn(*args)
    return time.perf_counter() - started, value


def peak_mib(batch: int) -> float:
    tracemalloc.start()
    replay_all(batch)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    setup_django(options.steps)
    from django.db import connection

    print(f"PostgreSQL {connection.cursor().connection.info.server_version}; database {DB}")
    seconds = fill(options.runs)
    print(f"recorded {options.runs} runs x {options.steps} steps in {seconds:.1f} s")
    reads, replays = [], []
    for round_number in range(1, options.rounds + 1):
        read_time, count = timed(read_all, options.batch)
        replay_time, summary = timed(replay_all, options.batch)
        assert count == options.runs and summary.ok == options.runs, summary.line()
        reads.append(read_time)
        replays.append(replay_time)
        print(f"round {round_number}: reading {read_time:.2f} s, replaying {replay_time:.2f} s")
    small, large = peak_mib(options.batch), peak_mib(options.batch * 10)
    read, replay = statistics.median(reads), statistics.median(replays)
    print(
        f"replay: {options.runs} runs x {options.steps} steps in {replay:.2f} s "
        f"({options.runs / replay:.0f} runs/s, {replay / options.runs * 1000:.2f} ms/run); "
        f"{replay / read:.1f}x reading alone ({read:.2f} s); peak memory {small:.1f} MiB at batch "
        f"{options.batch}, {large:.1f} MiB at batch {options.batch * 10}"
    )


if __name__ == "__main__":
    main()
