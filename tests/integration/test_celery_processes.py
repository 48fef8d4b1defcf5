"""Real ``celery worker`` and ``celery beat`` processes, PostgreSQL and Redis.

Lease settings are the suite's short ones (tests/settings.py): TTL 3 s, renewed every
0.5 s, takeover grace 0.5 s, tick every 0.2 s.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings

from django_weft import client
from django_weft.models import Step, Timer, WorkflowRun
from django_weft.store import DjangoStore
from tests.testapp.models import SideEffect

from .conftest import CeleryCluster, celery_env, free_port, use_broker, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def all_finished(run_ids: list[str]) -> bool:
    return not WorkflowRun.objects.filter(pk__in=run_ids).exclude(status="completed").exists()


def wait_all_completed(cluster: CeleryCluster, run_ids: list[str], timeout: float) -> None:
    try:
        wait_for(lambda: all_finished(run_ids), timeout, f"{len(run_ids)} runs to complete", interval=0.2)
    except AssertionError:
        counts = Counter(WorkflowRun.objects.filter(pk__in=run_ids).values_list("status", flat=True))
        raise AssertionError(f"runs not completed: {dict(counts)}\n{cluster.logs()}") from None


def test_kill_9_of_a_worker_mid_run_is_recovered_within_the_lease_bound(
    celery_cluster: CeleryCluster,
) -> None:
    # The bound is lease expiry (at most TTL after the kill: the last renewal came before
    # it), the takeover grace and a sweep; the sweep drives a takeover itself, so it does
    # not wait behind the queue of a busy worker.
    victim = celery_cluster.worker(concurrency=3)
    survivor = celery_cluster.worker(concurrency=6)
    celery_cluster.beat()
    for process in (victim, survivor):
        process.wait_ready()
    runs = [
        client.start("tests.slow_steps_with_sleep", args=[f"k{i}"], kwargs={"step_seconds": 0.02}).run_id
        for i in range(50)
    ]
    store = DjangoStore()

    def victims() -> dict[str, str]:
        pool = {str(pid) for pid in victim.pool_pids()}
        owned = WorkflowRun.objects.filter(pk__in=runs, owner_id__isnull=False).values_list("pk", "owner_id")
        return {str(pk): owner for pk, owner in owned if owner.split(":")[1] in pool}

    wait_for(lambda: len(victims()) >= 2, 30, "the victim worker to drive runs", interval=0.005)
    held = victims()
    victim.kill()
    killed_at = store.db_now()
    # A turn that finished between the look and the kill left nothing to take over.
    still = WorkflowRun.objects.filter(pk__in=list(held)).values_list("pk", "owner_id")
    held = {str(pk): owner for pk, owner in still if owner == held[str(pk)]}
    assert held, "the victim's turns all finished before the kill; nothing to take over"
    leases = {
        str(pk): lease
        for pk, lease in WorkflowRun.objects.filter(pk__in=list(held)).values_list("pk", "lease_expires_at")
    }
    # When did another engine first claim each run the dead worker held?
    recovered: dict[str, float] = {}
    breakdown: dict[str, str] = {}
    deadline = time.monotonic() + 30
    while len(recovered) < len(held) and time.monotonic() < deadline:
        rows = WorkflowRun.objects.filter(pk__in=list(held)).values_list(
            "pk", "owner_id", "claimed_at", "status"
        )
        for pk, owner, claimed_at, status in rows:
            if str(pk) in recovered:
                continue
            if claimed_at and claimed_at > killed_at and owner != held[str(pk)]:
                recovered[str(pk)] = (claimed_at - killed_at).total_seconds()
                expiry = (leases[str(pk)] - killed_at).total_seconds()
                breakdown[str(pk)] = (
                    f"lease ran out {expiry:.2f} s after the kill, claimed at {recovered[str(pk)]:.2f} s"
                )
            elif status == "completed":
                raise AssertionError(f"run {pk} completed without a recorded takeover")
        time.sleep(0.02)
    assert len(recovered) == len(held), (
        f"not taken over: {set(held) - set(recovered)}\n{celery_cluster.logs()}"
    )
    wait_all_completed(celery_cluster, runs, 90)

    bound = settings.WEFT_LEASE_TTL + 2 * settings.WEFT_LEASE_RENEW_INTERVAL + 2 * settings.WEFT_TICK_INTERVAL
    worst = max(recovered.values())
    print(f"\nkill -9 recovery of {len(held)} runs: worst {worst:.2f} s, bound {bound:.2f} s")
    for line in breakdown.values():
        print(f"  {line}")
    assert worst <= bound, f"recovery took {worst:.2f} s; bound {bound:.2f} s: {breakdown}"
    # Every step recorded exactly once; only a step in flight at the kill ran twice.
    assert Step.objects.filter(run_id__in=runs).count() == 50 * 11
    executions = Counter(SideEffect.objects.filter(key__startswith="k").values_list("key", flat=True))
    assert len(executions) == 50 * 10
    repeated = {key: n for key, n in executions.items() if n > 1}
    assert all(n == 2 for n in repeated.values()) and len(repeated) <= len(held), repeated


def test_every_run_completes_after_the_broker_was_down_for_10_s(tmp_path: Path) -> None:
    server = shutil.which("redis-server")
    assert server, "this test starts its own Redis broker and needs redis-server on PATH"
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"

    def start_redis() -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        wait_for(lambda: _pings(redis.Redis(port=port)), 10, "redis to start")
        return process

    redis_process = start_redis()
    cluster = CeleryCluster(tmp_path, url, celery_env(url))

    from django_weft.runtime.dispatch import _instantiate

    use_broker(url)
    _instantiate.cache_clear()
    try:
        with override_settings(WEFT_DISPATCHER="django_weft.contrib.celery.dispatch.CeleryDispatcher"):
            workers = [cluster.worker(concurrency=4), cluster.worker(concurrency=4)]
            cluster.beat()
            for worker in workers:
                worker.wait_ready()
            runs = [
                client.start("tests.steps_with_sleep", args=[f"b{i}"], kwargs={"sleep": 2}).run_id
                for i in range(20)
            ]
            wait_for(
                lambda: WorkflowRun.objects.filter(pk__in=runs, status="waiting").count() == 20,
                30,
                "all runs to reach their sleep",
            )
            # The broker goes away with every message in it (it keeps nothing on disk),
            # including the wake-ups of the sleeping runs.
            redis_process.kill()
            redis_process.wait(10)
            # Celery 5.7 / kombu 5.7 workers holding unacknowledged messages may exit on the
            # lost connection ("Unrecoverable error"); in production a supervisor (systemd,
            # Kubernetes) starts them again, and so does this loop, as soon as they exit.
            restarts = 0
            outage_ends = time.monotonic() + 10
            while time.monotonic() < outage_ends or redis_process.poll() is not None:
                if time.monotonic() >= outage_ends:
                    redis_process = start_redis()
                for index, worker in enumerate(workers):
                    if worker.process.poll() is not None:
                        workers[index] = cluster.worker(concurrency=4)
                        restarts += 1
                time.sleep(0.2)
            # A worker that kept running may have finished some runs meanwhile: Celery holds
            # wake-ups with an ETA in the worker's memory, and a turn needs only the
            # database. The rest wait for the broker, and for the sweep to send them again.
            during = WorkflowRun.objects.filter(pk__in=runs, status="completed").count()
            wait_all_completed(cluster, runs, 60)
            print(
                f"\nbroker down 10 s: all 20 runs completed ({during} during the outage, "
                f"{restarts} worker restarts)"
            )
    finally:
        cluster.stop()
        redis_process.kill()
        redis_process.wait(10)
        use_broker(str(settings.CELERY_BROKER_URL))
    assert Step.objects.filter(run_id__in=runs).count() == 20 * 7


def _pings(connection: object) -> bool:
    try:
        return bool(connection.ping())  # type: ignore[attr-defined]
    except Exception:
        return False


def test_duplicate_deliveries_of_every_message_record_nothing_twice(celery_cluster: CeleryCluster) -> None:
    doubling = {"WEFT_TEST_DISPATCHER": "tests.dispatchers.DoublingCeleryDispatcher"}
    workers = [celery_cluster.worker(concurrency=4, **doubling) for _ in range(2)]
    celery_cluster.beat(**doubling)
    for worker in workers:
        worker.wait_ready()

    from django_weft.runtime.dispatch import _instantiate

    _instantiate.cache_clear()
    with override_settings(WEFT_DISPATCHER="tests.dispatchers.DoublingCeleryDispatcher"):
        runs = [client.start("tests.q.single", args=[f"d{i}"]).run_id for i in range(20)]
        runs += [client.start("tests.q.fan_out", args=[f"df{i}", 4]).run_id for i in range(10)]
        wait_all_completed(celery_cluster, runs, 60)
    executions = Counter(SideEffect.objects.filter(key__startswith="d").values_list("key", flat=True))
    assert len(executions) == 20 * 3 + 10 * 4
    assert set(executions.values()) == {1}, {k: n for k, n in executions.items() if n > 1}
    skipped = sum(p.log.count("is not startable (duplicate or stale)") for p in workers)
    assert skipped >= 20 + 10 * 4 - 5, "the duplicate activity messages were not delivered"
    assert all(step.attempt == 1 for step in Step.objects.filter(run_id__in=runs, kind="activity"))


def test_two_beats_fire_every_timer_exactly_once(celery_cluster: CeleryCluster) -> None:
    debug = {"WEFT_LOG_LEVEL": "DEBUG"}
    workers = [celery_cluster.worker(concurrency=4, **debug) for _ in range(2)]
    celery_cluster.beat()
    celery_cluster.beat()
    for worker in workers:
        worker.wait_ready()
    runs = [client.start("tests.sleeps", args=[3, 0.3]).run_id for _ in range(30)]
    wait_all_completed(celery_cluster, runs, 60)
    fired = Counter(
        int(pk) for worker in workers for pk in re.findall(r"fired timer (\d+) \(run", worker.log)
    )
    timers = set(Timer.objects.filter(run_id__in=runs).values_list("pk", flat=True))
    assert len(timers) == 30 * 3
    assert set(fired) == timers
    assert set(fired.values()) == {1}, {pk: n for pk, n in fired.items() if n > 1}
    ticks = sum(worker.log.count("Task django_weft.tick[") for worker in workers)
    assert ticks > 10  # both beats were sending


def test_ten_queued_one_second_activities_run_in_parallel(celery_cluster: CeleryCluster) -> None:
    worker = celery_cluster.worker(concurrency=10)
    celery_cluster.beat()
    worker.wait_ready()
    warm = client.start("tests.q.fan_out", args=["warm", 10, 0.0])
    warm.result(timeout=30)  # every pool process has imported Django and connected
    started = time.monotonic()
    handle = client.start("tests.q.fan_out", args=["par", 10, 1.0])
    assert handle.result(timeout=30) == [f"par:{i}" for i in range(10)]
    elapsed = time.monotonic() - started
    print(f"\nfan-out of 10 x 1 s queued activities: {elapsed:.2f} s")
    assert elapsed < 3.0, elapsed
    steps = Step.objects.filter(run_id=handle.run_id, kind="activity")
    spread = max(s.started_at for s in steps) - min(s.started_at for s in steps)
    assert spread < timedelta(seconds=1), spread


def test_a_worker_killed_mid_activity_leads_to_a_retry_on_another_worker(
    celery_cluster: CeleryCluster,
) -> None:
    first = celery_cluster.worker(concurrency=2)
    celery_cluster.beat()
    first.wait_ready()
    handle = client.start("tests.q.long_activity", args=["midact", 2.0])
    wait_for(
        lambda: Step.objects.filter(run_id=handle.run_id, status="started").exists(),
        30,
        "the attempt to start",
    )
    first.kill()
    second = celery_cluster.worker(concurrency=2)
    second.wait_ready()
    # The dead worker's attempt is lost when its lease runs out; attempt 2 runs on the other.
    assert handle.result(timeout=60) == 2
    assert SideEffect.objects.filter(key="midact").count() == 2
    recorded = Step.objects.get(run_id=handle.run_id, kind="activity")
    assert (recorded.status, recorded.attempt) == ("completed", 2)


def test_an_activity_timeout_is_the_tasks_soft_time_limit(celery_cluster: CeleryCluster) -> None:
    worker = celery_cluster.worker(concurrency=2)
    celery_cluster.beat()
    worker.wait_ready()
    started = time.monotonic()
    handle = client.start("tests.q.overrun", args=["overrun"])
    outcome = handle.result(timeout=30)
    assert outcome.startswith("caught activity tests.q.overrun failed after 1 attempt(s): ")
    assert "SoftTimeLimitExceeded" in outcome
    assert time.monotonic() - started < 6  # the 8 s body was cut off at its 1 s timeout
