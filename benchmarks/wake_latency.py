"""How soon ``weft_worker`` takes new work: start → first step, and signal → recorded,
with PostgreSQL's work notices on (``WEFT_NOTIFY``, the default) and off (the worker
finds the work at its next sweep, every ``WEFT_TICK_INTERVAL``).

* **start → first step**: ``client.start`` of a run of one no-op step, from the call to
  the step's recorded ``finished_at``;
* **signal → recorded**: ``handle.signal("ping")`` to a run parked in
  ``ctx.wait_signal``, from the call to the recorded time of the step that consumed it.

One at a time (each measures a full wake-up; with notices off, 30 of each), against one
``weft_worker --threads 2``
started with the setting under test; the client is this process, with the sweep-only
dispatcher (``benchmarks/e2e_bench``, django_weft's defaults beside ``weft_worker``).
The summary line gives each p50 and p99 and the ratio of the p50s to the 5 ms target.
Usage::

    .venv/bin/python benchmarks/wake_latency.py [--samples 300] [--per-run 50] [--quick]

``weft_e2e_bench`` is dropped and recreated at every invocation.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from end_to_end import SETTINGS, Process, setup_weft  # noqa: E402
from steps import Server  # noqa: E402

TARGET_MS = 5.0
OFF_SAMPLES = 30
"""Samples of each kind with notices off, where each waits for the worker's next sweep."""


def poll(predicate: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    """A tight wait (1 ms): the latency is what is measured."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.001)
    return value


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _first_step_finished(run_id: str) -> Any:
    from django_weft.models import Step

    return Step.objects.filter(run_id=run_id, seq=0).values_list("finished_at", flat=True).first()


def _consumed_at(signal_pk: int) -> tuple[int] | None:
    """The position of the step that consumed the signal, once it did (a tuple: 0 is one)."""
    from django_weft.models import Signal

    seq = Signal.objects.filter(pk=signal_pk).values_list("consumed_seq", flat=True).first()
    return None if seq is None else (seq,)


def starts(samples: int) -> list[float]:
    from django_weft import client

    latencies = []
    for _ in range(samples):
        sent = time.time()
        run_id = client.start("bench.first_step").run_id
        finished = poll(lambda run_id=run_id: _first_step_finished(run_id), "the first step")
        latencies.append(finished.timestamp() - sent)
    return latencies


def signals(samples: int, per_run: int) -> list[float]:
    from django_weft import client
    from django_weft.models import Step, WorkflowRun

    latencies: list[float] = []
    while len(latencies) < samples:
        count = min(per_run, samples - len(latencies))
        handle = client.start("bench.signal_loop", args=[count])
        runs = WorkflowRun.objects.filter(pk=handle.run_id)
        for _ in range(count):
            poll(lambda runs=runs: runs.filter(status="waiting").exists(), "the run to wait")
            sent = time.time()
            accepted = handle.signal("ping")
            (seq,) = poll(lambda pk=accepted.sequence: _consumed_at(pk), "the signal to be consumed")
            recorded = Step.objects.get(run_id=handle.run_id, seq=seq).finished_at
            latencies.append(recorded.timestamp() - sent)
        handle.result(timeout=30)
    return latencies


def measure(notify: bool, args: argparse.Namespace, log_dir: Path) -> tuple[list[float], list[float]]:
    from django.conf import settings
    from django.test.utils import override_settings

    name = "notices" if notify else "no-notices"
    env = {"DJANGO_SETTINGS_MODULE": SETTINGS, "WEFT_E2E_BENCH_NOTIFY": "1" if notify else "0"}
    argv = ["-m", "django", "weft_worker", "--threads", "2", "--log-level", "WARNING"]
    worker = Process(f"weft_worker-{name}", argv, log_dir, env)
    try:
        with override_settings(WEFT_NOTIFY=notify):
            assert settings.WEFT_NOTIFY is notify
            starts(5)  # the worker is up, connected and warm
            signals(5, 5)
            # Without notices each sample waits for a sweep (up to WEFT_TICK_INTERVAL): fewer.
            samples = args.samples if notify else min(args.samples, OFF_SAMPLES)
            return starts(samples), signals(samples, min(args.per_run, samples))
    finally:
        worker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=300, help="starts, and signals, measured (300)")
    parser.add_argument("--per-run", type=int, default=50, help="signals per run (50)")
    parser.add_argument("--quick", action="store_true", help="a CI-sized run: 40 of each")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.per_run = 40, 20
    server = Server.from_env()
    setup_weft(server, notify=True)
    log_dir = Path(tempfile.mkdtemp(prefix="weft-wake-"))
    print(f"PostgreSQL {server.version()}; {os.cpu_count()} CPUs; weft_worker --threads 2; logs in {log_dir}")
    figures: dict[bool, tuple[list[float], list[float]]] = {}
    for notify in (True, False):
        figures[notify] = measure(notify, args, log_dir)
        started, signalled = figures[notify]
        state = "on " if notify else "off"
        print(
            f"notices {state}: start -> first step p50 {percentile(started, 0.5):.1f} ms "
            f"p99 {percentile(started, 0.99):.1f} ms | signal -> recorded "
            f"p50 {percentile(signalled, 0.5):.1f} ms p99 {percentile(signalled, 0.99):.1f} ms",
            flush=True,
        )
    started, signalled = figures[True]
    off_started, off_signalled = figures[False]
    print(
        f"wake latency, notices on: start -> first step p50 {percentile(started, 0.5):.1f} ms "
        f"({percentile(started, 0.5) / TARGET_MS:.2f}x of {TARGET_MS:.0f} ms), signal -> recorded p50 "
        f"{percentile(signalled, 0.5):.1f} ms ({percentile(signalled, 0.5) / TARGET_MS:.2f}x); notices off: "
        f"p50 {percentile(off_started, 0.5):.1f} and {percentile(off_signalled, 0.5):.1f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
