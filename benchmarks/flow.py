"""Flow control's cost: steps per second of one in-process worker (``weft_worker``'s
threads, fed by its local queue) draining N runs of K inline no-op steps, for a workflow
without a limit, with a concurrency limit that is never reached, and with a saturated
limit (one slot per key, 100 keys, each key's runs started one after another so the
threads keep meeting a taken slot). For the saturated limit it also measures the gap
between a run's end and the claim of the next run of its key (the hand-on).

Prints one summary line: the three rates, the ratios to the run without a limit, and
the hand-on gap's median and 99th percentile. The parts alternate for ``--rounds``
rounds; rates and ratios are medians over rounds.

    .venv/bin/python benchmarks/flow.py [--runs 1000] [--steps 10] [--threads 4] [--rounds 3]

Uses (and resets) the database ``weft_flow_bench`` on the server of PGHOST/PGPORT/PGUSER.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import steps as base

KEYS = 100
CASES = ("plain", "never", "saturated")
HAND_ON_KEYS = 2
"""Keys of the hand-on measurement: fewer than the threads, so a run let in by a freed
slot finds a thread free and the gap is the hand-on's own (let in, doorbell, claim)."""
NAMES = {case: f"bench.flow.{case}" for case in CASES}


def register() -> None:
    from django_weft import Concurrency, WorkflowContext, activity, workflow

    @activity(name="bench.flow.noop")
    def noop(value: int) -> int:
        return value

    def body(ctx: WorkflowContext, key: str, count: int) -> int:
        for i in range(count):
            ctx.run(noop, i)
        return count

    def by_key(key: str, count: int) -> str:
        return key

    workflow(name=NAMES["plain"])(body)
    workflow(name=NAMES["never"], concurrency=Concurrency(limit=1_000_000))(body)
    workflow(name=NAMES["saturated"], concurrency=Concurrency(limit=1, key=by_key))(body)


@dataclass(frozen=True)
class Result:
    steps_per_second: float
    gaps_ms: list[float]
    """From a run's end to the claim of the next run of its key."""


def bench(case: str, runs: int, steps: int, threads: int, *, keys: int = KEYS) -> Result:
    from django_weft import client
    from django_weft.models import WorkflowRun
    from django_weft.runtime.inprocess import InProcessWorker

    WorkflowRun.objects.all().delete()
    worker = InProcessWorker(threads=threads, sweep=True)  # its local queue is this process's dispatcher
    per_key = max(runs // keys, 1)
    ids = [
        client.start(NAMES[case], args=[f"k{i // per_key}", steps]).run_id  # each key's runs together
        for i in range(runs)
    ]
    base._quiet_gc()
    began = time.perf_counter()
    worker.start()
    try:
        while WorkflowRun.objects.filter(pk__in=ids, status="completed").count() < runs:
            time.sleep(0.01)
        elapsed = time.perf_counter() - began
    finally:
        worker.stop(timeout=10)
    gaps: list[float] = []
    if case == "saturated":
        # The next run of a key is claimed after the previous one ended: the hand-on (let
        # in by the ending, its doorbell rung, taken from the local queue by a thread).
        rows = WorkflowRun.objects.filter(pk__in=ids).values_list(
            "concurrency_key", "claimed_at", "finished_at"
        )
        by_key: dict[str, list[Any]] = {}
        for key, claimed, ended in rows:
            by_key.setdefault(key, []).append((claimed, ended))
        for runs_of_key in by_key.values():
            runs_of_key.sort()
            for (_, ended), (claimed, _) in itertools.pairwise(runs_of_key):
                gaps.append((claimed - ended).total_seconds() * 1000)
    return Result(runs * steps / elapsed, gaps)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    server = base.Server.from_env()
    base.WEFT_DB = "weft_flow_bench"
    base.setup_django(server)
    from django.conf import settings

    settings.WEFT_TICK_INTERVAL = 0.2
    register()
    print(base.weft_revision(), flush=True)
    bench("plain", 100, args.steps, args.threads)  # warm-up
    rates: dict[str, list[float]] = {case: [] for case in CASES}
    gaps: list[float] = []
    for round_ in range(args.rounds):
        line = []
        for case in CASES:
            result = bench(case, args.runs, args.steps, args.threads)
            rates[case].append(result.steps_per_second)
            line.append(f"{case} {result.steps_per_second:,.0f} steps/s")
        gaps += bench("saturated", 100, args.steps, args.threads, keys=HAND_ON_KEYS).gaps_ms
        print(f"round {round_ + 1}: " + " | ".join(line), flush=True)
    ratio: dict[str, Any] = {
        case: statistics.median(r / p for r, p in zip(rates[case], rates["plain"], strict=True))
        for case in CASES
    }
    plain = statistics.median(rates["plain"])
    print(
        f"flow control, {args.runs} runs x {args.steps} steps, {args.threads} threads: "
        f"no limit {plain:,.0f} steps/s | limit never reached {statistics.median(rates['never']):,.0f} "
        f"({ratio['never']:.2f}x) | saturated, {KEYS} keys x 1 slot "
        f"{statistics.median(rates['saturated']):,.0f} "
        f"({ratio['saturated']:.2f}x) | hand-on ({HAND_ON_KEYS} keys x 1 slot, threads free), a run's end "
        "to the claim of its key's next run: "
        f"p50 {percentile(gaps, 0.5):.1f} ms, p99 {percentile(gaps, 0.99):.1f} ms",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
