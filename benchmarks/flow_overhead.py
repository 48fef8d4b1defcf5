"""What flow control costs an activity attempt that it never holds: steps per second of
an inline activity without flow control, with a rate limit it never reaches, and with a
concurrency limit it never reaches, on PostgreSQL.

``weft_flow_bench`` is created afresh; each round drives ``--runs`` runs of a workflow of
``--steps`` inline steps for each variant, one engine in one thread (as ``steps.py``
does), the variants in turn so that a slow period of the machine is shared by all. The
rate limit allows a million attempts a second (one every microsecond: a single thread
never reaches it), the concurrency limit a thousand attempts at once. Each step then
costs one more statement (the rate limit's ``INSERT ... ON CONFLICT DO UPDATE``), or two
more transactions (taking and giving back a slot).

The summary line gives the medians over rounds: steps/s of each variant, the ratio to
the plain activity, and the extra time per attempt.

Usage::

    .venv/bin/python benchmarks/flow_overhead.py [--runs 100] [--steps 20] [--rounds 3]

Connection settings come from PGHOST, PGPORT, PGUSER and PGPASSWORD (default
127.0.0.1:5432, user postgres). ``weft_flow_bench`` is dropped and recreated at every
invocation.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import common  # noqa: E402 - after the path is set

DB = "weft_flow_bench"
VARIANTS = ("plain", "rate_limit", "concurrency")


def setup_django(steps: int) -> None:
    common.setup_django(DB, urlconf="benchmarks.api_urls")

    from django_weft import Concurrency, RateLimit, WorkflowContext, activity, workflow

    @activity(name="bench.plain")
    def plain(i: int) -> int:
        return i

    @activity(name="bench.rate_limit", rate_limit=RateLimit("bench.never", limit=1_000_000, per="1s"))
    def rate_limited(i: int) -> int:
        return i

    @activity(name="bench.concurrency", concurrency=Concurrency(limit=1000))
    def slotted(i: int) -> int:
        return i

    acts = {"plain": plain, "rate_limit": rate_limited, "concurrency": slotted}
    for variant, act in acts.items():

        def body(ctx: WorkflowContext, act=act) -> int:  # type: ignore[no-untyped-def]
            return sum(ctx.run(act, i) for i in range(steps))

        workflow(body, name=f"bench.{variant}")


def drive(variant: str, runs: int) -> float:
    """Start ``runs`` runs of the variant, then time driving each to completion."""
    from django_weft import client
    from django_weft.models import Step, WorkflowRun
    from django_weft.testing import make_engine

    engine = make_engine(f"bench-{variant}")
    handles = [client.start(f"bench.{variant}") for _ in range(runs)]
    started = time.perf_counter()
    for handle in handles:
        engine.run_turn(handle.run_id)
    seconds = time.perf_counter() - started
    ids = [handle.run_id for handle in handles]
    done = WorkflowRun.objects.filter(pk__in=ids, status="completed").count()
    assert done == runs, f"{variant}: {done} of {runs} runs completed"
    assert not Step.objects.filter(run_id__in=ids).exclude(status="completed").exists(), "an attempt was held"
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    setup_django(options.steps)
    from django.db import connection

    print(f"PostgreSQL {connection.cursor().connection.info.server_version}; database {DB}")
    total = options.runs * options.steps
    for variant in VARIANTS:
        drive(variant, max(options.runs // 10, 1))  # warm-up, untimed
    rates: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for round_number in range(1, options.rounds + 1):
        line = []
        for variant in VARIANTS:
            rates[variant].append(total / drive(variant, options.runs))
            line.append(f"{variant} {rates[variant][-1]:.0f} steps/s")
        print(f"round {round_number}: " + ", ".join(line))
    plain = statistics.median(rates["plain"])
    parts = [f"plain {plain:.0f} steps/s"]
    for variant, label in (
        ("rate_limit", "never-reached rate limit"),
        ("concurrency", "never-reached concurrency"),
    ):
        rate = statistics.median(rates[variant])
        ratio = statistics.median(r / p for r, p in zip(rates[variant], rates["plain"], strict=True))
        extra_us = (1 / rate - 1 / plain) * 1_000_000
        parts.append(f"{label} {rate:.0f} steps/s ({ratio:.2f}x, +{extra_us:.0f} µs/attempt)")
    print(
        f"flow overhead ({options.runs} runs x {options.steps} steps, {options.rounds} rounds): "
        + " | ".join(parts)
    )


if __name__ == "__main__":
    main()
