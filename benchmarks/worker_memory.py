"""A ``weft_worker`` process's memory over many runs: its resident set size (RSS) after
a warm-up, after 10,000 runs and after 100,000 runs, side by side.

One ``weft_worker --threads 2`` (django_weft's defaults, work notices on) drains runs of
``bench.steps`` (K inline no-op steps, 2 by default) that this process starts in batches
as fast as the worker takes them, keeping at most ``--window`` runs waiting. The
worker's RSS is read from ``/proc/<pid>/status`` (``VmRSS``) once all the runs up to a
mark have completed, after a short pause for the worker to settle. The summary line gives
the RSS at each mark and the growth from 10,000 to 100,000 runs (the goal: 20 MB at
most), and from the warm-up to 100,000.

Usage (see benchmarks/README.md)::

    .venv/bin/python benchmarks/worker_memory.py [--runs 100000] [--first-mark 10000] [--warmup 1000]
                                                 [--steps 2] [--threads 2] [--quick]

It uses ``end_to_end.py``'s project (``benchmarks/e2e_bench/``) and drops and recreates
``weft_e2e_bench``. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from end_to_end import SETTINGS, WORKFLOW, Process, setup_weft, wait_for  # noqa: E402
from steps import Server, weft_revision  # noqa: E402


def rss_mb(pid: int) -> float:
    """The process's resident set size, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def run_until(total: int, started: int, steps: int, window: int, worker: Process) -> int:
    """Start runs until ``total`` have been started, at most ``window`` of them not yet
    completed at any moment; then wait until every one has completed. Returns ``total``."""
    from django_weft import client
    from django_weft.models import WorkflowRun

    def completed() -> int:
        return WorkflowRun.objects.filter(status="completed").count()

    while started < total:
        done = completed()
        batch = min(total - started, window - (started - done))
        if batch <= 0:
            worker.check_alive()
            time.sleep(0.05)
            continue
        for _ in range(batch):
            client.start(WORKFLOW, args=[steps])
        started += batch
    wait_for(lambda: completed() >= total, f"{total} runs", 3600, worker.check_alive)
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000, help="runs in all (100000)")
    parser.add_argument("--first-mark", type=int, default=10_000, help="the first measurement (10000)")
    parser.add_argument("--warmup", type=int, default=1000, help="runs before the baseline RSS (1000)")
    parser.add_argument("--steps", type=int, default=2, help="inline no-op steps per run (2)")
    parser.add_argument("--threads", type=int, default=2, help="weft_worker threads (2)")
    parser.add_argument("--window", type=int, default=500, help="runs waiting at most (500)")
    parser.add_argument(
        "--quick", action="store_true", help="a CI-sized run: 5,000 runs, measured at 200, 1,000 and 5,000"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.first_mark, args.warmup = 5000, 1000, 200
    server = Server.from_env()
    setup_weft(server, notify=True)
    log_dir = Path(tempfile.mkdtemp(prefix="weft-memory-bench-"))
    print(f"PostgreSQL {server.version()}; {weft_revision()}; weft_worker --threads {args.threads}; "
          f"runs of {args.steps} steps; logs in {log_dir}", flush=True)  # fmt: skip
    worker = Process(
        "weft_worker",
        ["-m", "django", "weft_worker", "--threads", str(args.threads), "--log-level", "WARNING"],
        log_dir,
        {"DJANGO_SETTINGS_MODULE": SETTINGS},
    )
    pid = worker.process.pid
    marks: dict[int, float] = {}
    try:
        began = time.monotonic()
        started = 0
        for mark in (args.warmup, args.first_mark, args.runs):
            started = run_until(mark, started, args.steps, args.window, worker)
            time.sleep(2)  # the worker's threads go idle; its sweep and heartbeat carry on
            marks[mark] = rss_mb(pid)
            print(f"{mark} runs: RSS {marks[mark]:.1f} MB ({time.monotonic() - began:.0f} s)", flush=True)
    finally:
        worker.stop()
    warm, first, last = (marks[mark] for mark in (args.warmup, args.first_mark, args.runs))
    print(
        f"worker memory: RSS {warm:.1f} MB after {args.warmup} runs, {first:.1f} MB after {args.first_mark}, "
        f"{last:.1f} MB after {args.runs} | growth {args.first_mark} -> {args.runs}: {last - first:+.1f} MB "
        f"({max(last - first, 0) / 20:.2f}x of the goal, 20 MB), "
        f"{args.warmup} -> {args.runs}: {last - warm:+.1f} MB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
