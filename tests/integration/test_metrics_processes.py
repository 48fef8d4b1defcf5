"""Prometheus metrics in multi-process mode (``PROMETHEUS_MULTIPROC_DIR``): three
``weft_worker`` processes share the runs, and the counters summed over the processes
equal the runs, turns and attempts the database records."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db.models import Sum
from prometheus_client import CollectorRegistry, multiprocess

from django_weft import client
from django_weft.models import Step, WorkflowRun

from .conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CHILDREN = 8
STEPS = 2
"""Queued activities per child: each child has ``STEPS + 1`` turns."""


def samples(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of every process in ``directory``, summed as an exporter sums them."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            found[key] = found.get(key, 0.0) + sample.value
    return found


def total(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        number
        for (sample, sample_labels), number in found.items()
        if sample == name and set(labels.items()) <= set(sample_labels)
    )


def test_three_worker_processes_count_every_run_turn_and_attempt_once(start_worker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    directory = tmp_path / "prometheus"
    directory.mkdir()
    env = {
        "WEFT_TEST_METRICS": "1",
        "PROMETHEUS_MULTIPROC_DIR": str(directory),
        "WEFT_TEST_METRICS_SAMPLE_INTERVAL": "0.5",
    }
    workers = [start_worker(env_vars=env) for _ in range(3)]
    parents = [client.start("tests.obs.fan_out", args=[CHILDREN, STEPS]) for _ in range(2)]
    plain = [client.start("tests.obs.plain", args=[3]) for _ in range(6)]
    for handle in parents:
        assert handle.result(timeout=120) == CHILDREN * STEPS
    for handle in plain:
        assert handle.result(timeout=60) == 3
    runs = WorkflowRun.objects.all()
    assert runs.count() == 2 + 2 * CHILDREN + 6
    assert set(runs.values_list("status", flat=True)) == {"completed"}
    # No run was taken over or changed from outside, so each epoch is one claim, and each
    # claim one turn, but for those a worker's sweep made for its threads and released
    # when no thread took them in time (each logged).
    epochs = runs.aggregate(n=Sum("owner_epoch"))["n"]
    claims = epochs - sum(worker.log.count(": released, not driven") for worker in workers)
    queued = Step.objects.filter(name="tests.obs.queued").count()
    inline = Step.objects.filter(name="tests.obs.echo").count()
    assert (queued, inline) == (2 * CHILDREN * STEPS, 6 * 3)
    # The processes wrote their files; they are read as an exporter would, workers live.
    assert all(worker.alive() for worker in workers)
    pids = {path.name.rsplit("_", 1)[-1].removesuffix(".db") for path in directory.glob("counter_*.db")}
    assert len(pids) == 3, pids  # each worker recorded something

    found = samples(directory)
    # Runs started in the worker processes: the children (the parents and the plain runs
    # were started by this test's process, whose metrics are not recorded).
    assert total(found, "weft_runs_started_total") == 2 * CHILDREN
    assert total(found, "weft_runs_finished_total", status="completed") == runs.count()
    assert total(found, "weft_activity_attempts_total", activity="tests.obs.queued") == queued
    assert total(found, "weft_activity_attempts_total", activity="tests.obs.echo") == inline
    assert total(found, "weft_activity_attempts_total", outcome="completed") == queued + inline
    assert total(found, "weft_activity_duration_seconds_count") == queued + inline
    assert total(found, "weft_turn_duration_seconds_count") == claims
    # schedule_to_start: one observation per claim (turns) and per queued attempt taken.
    assert total(found, "weft_schedule_to_start_seconds_count", kind="first_turn") == runs.count()
    assert total(found, "weft_schedule_to_start_seconds_count", kind="woken") == claims - runs.count()
    assert total(found, "weft_schedule_to_start_seconds_count", kind="activity") == queued
    assert total(found, "weft_schedule_to_start_seconds_count") == claims + queued
    assert total(found, "weft_lease_takeovers_total") == 0
    assert total(found, "weft_deposed_writes_total") == 0
    # The gauges: the latest value a live process's tick wrote (livemostrecent), not a
    # sum over the processes. A tick after the last run finished sees nothing active.
    finished = max(runs.values_list("finished_at", flat=True)).timestamp()
    wait_for(
        lambda: total(samples(directory), "weft_queues_sampled_at_seconds") > finished,
        10,
        "a tick to sample the queues after the last run finished",
    )
    found = samples(directory)
    for status in ("running", "waiting", "pending", "suspended"):
        assert total(found, "weft_runs", status=status, estimate="false") == 0, status
    assert total(found, "weft_due_timers") == 0
