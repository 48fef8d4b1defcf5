"""Signal and update latency through real Celery workers (Redis broker, PostgreSQL).

* **signal**: ``handle.signal("ping")`` to a run parked in ``ctx.wait_signal``, until the
  step that consumed it is recorded (the run was woken, a worker claimed it, replayed
  its history and recorded the signal). Measured from the call to the step's recorded
  time; one signal at a time, so each is a full round trip through the broker.
* **update**: ``handle.update("bump", 1)`` to a run blocked in ``ctx.wait_condition``,
  from the call until it returns the handler's result (the caller's validation replay,
  the durable acceptance, the wake-up, the application and the caller's poll).

``--signals`` of each (default 500) over runs of ``--per-run`` messages (default 50), so
histories stay as long as a real workflow's. Prints p50/p99 and one summary line with
the ratio of each p50 and p99 to its target (p50 < 20 ms, p99 < 100 ms). Usage::

    .venv/bin/python benchmarks/signal_latency.py [--signals 500] [--per-run 50]

The database ``weft_celery_bench`` is dropped and recreated and Redis database 14
flushed at every invocation, as for ``celery_throughput.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from celery_throughput import Cluster, Result, setup  # noqa: E402
from steps import Server  # noqa: E402

TARGET_P50_MS = 20.0
TARGET_P99_MS = 100.0


def poll(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    """A tight wait (1 ms): here the latency is what is measured, one message at a time."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.001)


def _consumed_at(signal_pk: int) -> tuple[int] | None:
    from django_weft.models import Signal

    seq = Signal.objects.filter(pk=signal_pk).values_list("consumed_seq", flat=True).first()
    return None if seq is None else (seq,)


def bench_signals(total: int, per_run: int) -> Result:
    from django_weft import client
    from django_weft.models import Step, WorkflowRun

    latencies: list[float] = []
    began = time.time()
    while len(latencies) < total:
        count = min(per_run, total - len(latencies))
        handle = client.start("bench.signal_loop", args=[count])
        runs = WorkflowRun.objects.filter(pk=handle.run_id)
        poll(lambda runs=runs: runs.filter(status="waiting").exists(), 30, "the run to wait")
        for index in range(count):
            sent = time.time()
            accepted = handle.signal("ping")
            seq = poll(lambda pk=accepted.sequence: _consumed_at(pk), 30, "the signal to be consumed")[0]
            recorded = Step.objects.get(run_id=handle.run_id, seq=seq).finished_at
            latencies.append(recorded.timestamp() - sent)
            if index < count - 1:
                # Parked again before the next signal, so each one wakes a parked run.
                poll(lambda runs=runs: runs.filter(status="waiting").exists(), 30, "the run to park")
        handle.result(timeout=30)
    return Result(total, time.time() - began, latencies)


def bench_updates(total: int, per_run: int) -> Result:
    from django_weft import client
    from django_weft.models import WorkflowRun

    latencies: list[float] = []
    began = time.time()
    while len(latencies) < total:
        count = min(per_run, total - len(latencies))
        handle = client.start("bench.counter")
        runs = WorkflowRun.objects.filter(pk=handle.run_id)
        poll(lambda runs=runs: runs.filter(status="waiting").exists(), 30, "the run to wait")
        for expected in range(1, count + 1):
            sent = time.time()
            value = handle.update("bump", 1, wait=30)
            latencies.append(time.time() - sent)
            if value != expected:
                raise RuntimeError(f"update returned {value}, expected {expected}")
            poll(lambda runs=runs: runs.filter(status="waiting").exists(), 30, "the run to park")
        handle.update("stop", wait=30)
        handle.result(timeout=30)
    return Result(total, time.time() - began, latencies)


def latency(result: Result) -> str:
    return (
        f"p50 {result.percentile(0.5):6.1f} ms  p99 {result.percentile(0.99):6.1f} ms  "
        f"max {1000 * max(result.latencies):6.1f} ms  ({result.workflows} in {result.seconds:.1f} s)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--signals", type=int, default=500, help="signals, and updates, to send (500)")
    parser.add_argument("--per-run", type=int, default=50, help="messages per workflow run (50)")
    parser.add_argument("--concurrency", type=int, default=2, help="Celery worker processes (2)")
    args = parser.parse_args(argv)
    server = Server.from_env()
    setup(server)
    log_dir = Path(tempfile.mkdtemp(prefix="weft-signal-bench-"))
    cluster = Cluster(args.concurrency, log_dir)
    print(
        f"PostgreSQL {server.version()}, Redis broker; {os.cpu_count()} CPUs; celery worker prefork "
        f"x{args.concurrency}; {args.signals} signals and {args.signals} updates, {args.per_run} per run; "
        f"logs in {log_dir}",
        flush=True,
    )
    try:
        cluster.wait_ready()
        bench_signals(20, 10)  # warm-up: every pool process connects and imports
        bench_updates(20, 10)
        signals = bench_signals(args.signals, args.per_run)
        print(f"signal -> recorded: {latency(signals)}", flush=True)
        updates = bench_updates(args.signals, args.per_run)
        print(f"update round trip:  {latency(updates)}", flush=True)
    finally:
        cluster.stop()
    p50, p99 = signals.percentile(0.5), signals.percentile(0.99)
    print(
        f"signal_latency: signal p50 {p50:.1f} ms ({p50 / TARGET_P50_MS:.2f}x of the 20 ms target), "
        f"p99 {p99:.1f} ms ({p99 / TARGET_P99_MS:.2f}x of 100 ms) | update round trip "
        f"p50 {updates.percentile(0.5):.1f} ms, p99 {updates.percentile(0.99):.1f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
