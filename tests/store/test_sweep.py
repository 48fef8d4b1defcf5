"""The sweep: exactly-once timer firing under concurrent sweepers, re-dispatch rules."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from django_weft import client
from django_weft.models import Timer, WorkflowRun
from django_weft.runtime import tick
from django_weft.runtime.dispatch import LocalDispatcher
from django_weft.store import DjangoStore
from django_weft.testing import make_engine
from tests.support.threads import in_threads

pytestmark = pytest.mark.django_db(transaction=True)


def park_sleepers(count: int, seconds: float) -> list[str]:
    engine = make_engine()
    run_ids = [client.start("tests.sleepy", kwargs={"seconds": seconds}).run_id for _ in range(count)]
    for run_id in run_ids:
        assert engine.run_turn(run_id) == "parked"
    return run_ids


def test_concurrent_sweepers_fire_each_timer_exactly_once() -> None:
    run_ids = park_sleepers(40, 0.2)
    time.sleep(0.3)
    barrier = threading.Barrier(4)

    def sweep(_: int) -> list[str]:
        store = DjangoStore()
        barrier.wait()
        woken = []
        while True:
            batch = store.sweep.fire_due_timers(7)
            if not batch and not Timer.objects.due(store.db_now()).exists():
                return woken
            woken.extend(batch)

    woken = [run_id for fired in in_threads(sweep, 4, timeout=30) for run_id in fired]
    assert sorted(woken) == sorted(run_ids)  # each run woken once, none missed
    assert Timer.objects.filter(fired_at__isnull=True).count() == 0
    assert set(WorkflowRun.objects.values_list("status", flat=True)) == {"running"}


def test_tick_dispatches_runnable_runs_once_per_redispatch_interval() -> None:
    handle = client.start("tests.echo")
    dispatcher = LocalDispatcher()
    assert tick(dispatcher).run_ids == [handle.run_id]
    assert tick(dispatcher).run_ids == []  # dispatched recently: not sent again
    WorkflowRun.objects.filter(pk=handle.run_id).update(dispatched_at="2000-01-01T00:00:00Z")
    assert tick(dispatcher).run_ids == [handle.run_id]
    work = dispatcher.get(0.1)
    assert work is not None and work.run_id == handle.run_id and not work.is_activity
    assert dispatcher.get(0.05) is None  # duplicate dispatches are folded


def test_tick_redispatches_expired_leases_for_takeover() -> None:
    handle = client.start("tests.echo")
    store = DjangoStore()
    assert store.turns.claim(handle.run_id, "dead-engine", 30, 10) is not None
    dispatcher = LocalDispatcher()
    WorkflowRun.objects.filter(pk=handle.run_id).update(dispatched_at="2000-01-01T00:00:00Z")
    assert tick(dispatcher).run_ids == []  # live lease: leave it alone
    WorkflowRun.objects.filter(pk=handle.run_id).update(lease_expires_at="2000-01-01T00:00:00Z")
    assert tick(dispatcher).run_ids == [handle.run_id]
    assert make_engine().run_turn(handle.run_id) == "completed"
    assert WorkflowRun.objects.get(pk=handle.run_id).owner_epoch == 2


def test_an_expired_lease_is_dispatched_even_behind_a_full_batch_of_runnable_runs() -> None:
    """A sweep whose batch the runnable runs fill still sends one run whose worker lost
    it: ``weft_worker``'s sweep dispatches only what its threads have room for, and a
    backlog would otherwise hold the lost run back for as long as it lasts."""
    lost = client.start("tests.echo").run_id
    assert DjangoStore().turns.claim(lost, "dead-engine", 30, 10) is not None
    WorkflowRun.objects.filter(pk=lost).update(lease_expires_at="2000-01-01T00:00:00Z", dispatched_at=None)
    backlog = [client.start("tests.echo", args=[index]).run_id for index in range(3)]
    report = tick(LocalDispatcher(), redispatch_after=60, dispatch_limit=2)
    assert report.taken_over == [lost]
    assert len(set(report.run_ids) & set(backlog)) == 2
    assert tick(LocalDispatcher(), redispatch_after=60, dispatch_limit=0).run_ids == []


def test_a_turn_dispatched_at_the_timer_fires_it_itself() -> None:
    (run_id,) = park_sleepers(1, 0.1)
    time.sleep(0.15)
    # No sweep has run: the claim fires the due timer and claims in one transaction.
    assert make_engine().run_turn(run_id) == "completed"
    assert Timer.objects.get(run_id=run_id).fired_at is not None


def test_redispatch_backs_off_for_a_run_that_stays_unclaimed() -> None:
    handle = client.start("tests.echo")
    runs = WorkflowRun.objects.filter(pk=handle.run_id)
    now = DjangoStore().db_now()
    # Runnable for 100 s and last sent 30 s ago, when it had already waited 70 s: the
    # next copy waits until as long has passed since then (a lagging cluster is not flooded).
    runs.update(ready_at=now - timedelta(seconds=100), dispatched_at=now - timedelta(seconds=30))
    assert tick(LocalDispatcher()).run_ids == []
    runs.update(dispatched_at=now - timedelta(seconds=60))  # it had waited 40 s, 60 s ago
    assert tick(LocalDispatcher()).run_ids == [handle.run_id]
