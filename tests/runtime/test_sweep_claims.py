"""``weft_worker``'s sweep claims the runnable runs it hands its own threads (PostgreSQL):
one statement for the batch, the histories read with it, the runs held (their leases
renewed) while they wait in the process's queue, driven by the claim, never driven once
lost, and released at shutdown."""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_weft import client
from django_weft.conf import weft_settings
from django_weft.engine.executor import Engine
from django_weft.models import WorkflowRun
from django_weft.runtime.dispatch import LocalDispatcher, Work
from django_weft.runtime.inprocess import InProcessWorker
from django_weft.runtime.process import CurrentDispatcher
from django_weft.runtime.sweep import OwnThreads, tick
from django_weft.store import ClaimAs, DjangoStore
from django_weft.testing import make_engine
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the sweep claims for its threads on PostgreSQL only"
)


def row(run_id: str) -> dict[str, Any]:
    return dict(WorkflowRun.objects.values().get(pk=run_id))


def woken_sleeper() -> str:
    """A run that slept (its history: a step and the sleep) and whose timer has fired: runnable."""
    handle = client.start("tests.sleepy", kwargs={"seconds": 0.05})
    assert make_engine().run_turn(handle.run_id) == "parked"
    time.sleep(0.1)
    assert DjangoStore().sweep.fire_due_timers(100) == [handle.run_id]
    return handle.run_id


@postgres_only
def test_the_sweep_claims_runnable_runs_with_their_histories_in_priority_order() -> None:
    sleeper = woken_sleeper()
    high = client.start("tests.echo", args=[1], priority=5).run_id
    WorkflowRun.objects.update(dispatched_at=None)
    before = {run: row(run) for run in (sleeper, high)}
    sent = DjangoStore().sweep.claim_dispatch_batch(100, 0.0, 0.5, claim_as=ClaimAs("sweeper", 30.0, 100))
    assert (sent.runnable, sent.expired) == ([], [])
    assert [claimed.run_id for claimed in sent.claimed] == [high, sleeper]
    by_id = {claimed.run_id: claimed for claimed in sent.claimed}
    for run in (sleeper, high):
        after = row(run)
        assert after["owner_id"] == "sweeper" and after["owner_epoch"] == before[run]["owner_epoch"] + 1
        assert by_id[run].epoch == after["owner_epoch"] and not by_id[run].takeover
        assert after["dispatched_at"] == after["claimed_at"] == by_id[run].db_now
        lease = after["lease_expires_at"] - after["claimed_at"]
        assert lease == timedelta(seconds=30)
        assert by_id[run].due_at == before[run]["ready_at"]
    # The woken run's history is what a claim of its own reads; the new run has none.
    assert by_id[sleeper].steps == DjangoStore().sql.load_steps(sleeper) and len(by_id[sleeper].steps) == 2
    assert by_id[high].steps == {} and by_id[high].priority == 5


@postgres_only
def test_runs_waiting_for_a_concurrency_slot_and_expired_leases_are_sent_not_claimed() -> None:
    slotless = client.start("tests.echo", args=[1]).run_id
    WorkflowRun.objects.filter(pk=slotless).update(concurrency_key="k", slot="")
    lost = client.start("tests.echo", args=[2]).run_id
    WorkflowRun.objects.filter(pk=lost).update(
        owner_id="gone", owner_epoch=1, lease_expires_at=timezone.now() - timedelta(minutes=5)
    )
    sent = DjangoStore().sweep.claim_dispatch_batch(100, 0.0, 0.5, claim_as=ClaimAs("sweeper", 30.0, 100))
    assert (sent.runnable, sent.expired, sent.claimed) == ([slotless], [lost], ())
    assert row(slotless)["owner_id"] is None and row(lost)["owner_id"] == "gone"


@postgres_only
def test_the_sweep_claims_no_more_than_its_limit_and_only_runs_of_its_workflows() -> None:
    echo = [client.start("tests.echo", args=[index], priority=index).run_id for index in range(3)]
    sleepy = client.start("tests.sleepy", kwargs={"seconds": 60}).run_id
    WorkflowRun.objects.update(dispatched_at=None)
    store = DjangoStore().sweep
    sent = store.claim_dispatch_batch(100, 0.0, 0.5, claim_as=ClaimAs("sweeper", 30.0, 100, {"tests.sleepy"}))
    assert [claimed.run_id for claimed in sent.claimed] == [sleepy]
    assert sent.runnable == echo[::-1] and all(row(run)["owner_id"] is None for run in echo)
    WorkflowRun.objects.update(dispatched_at=None)
    sent = store.claim_dispatch_batch(100, 0.0, 0.5, claim_as=ClaimAs("sweeper", 30.0, 2))
    assert [claimed.run_id for claimed in sent.claimed] == [echo[2], echo[1]]  # the best first
    assert sent.runnable == [echo[0]] and row(echo[0])["owner_id"] is None


def test_without_claim_as_or_on_sqlite_the_sweep_only_marks_runs_dispatched() -> None:
    run = client.start("tests.echo").run_id
    WorkflowRun.objects.update(dispatched_at=None)
    claim_as = ClaimAs("sweeper", 30.0, 100) if connection.vendor == "sqlite" else None
    sent = DjangoStore().sweep.claim_dispatch_batch(100, 0.0, 0.5, claim_as=claim_as)
    assert (sent.runnable, sent.claimed) == ([run], ())
    assert row(run)["owner_id"] is None and row(run)["dispatched_at"] is not None


@postgres_only
def test_a_claimed_run_is_held_and_driven_by_its_claim_without_claiming_again() -> None:
    sleeper = woken_sleeper()
    engine, local = make_engine(), LocalDispatcher()
    report = tick(local, own_threads=OwnThreads(engine, local, 100))
    assert (report.dispatched, report.claimed, report.run_ids) == (1, 1, [sleeper])
    epoch = row(sleeper)["owner_epoch"]
    assert engine.held() == {sleeper: epoch}
    assert engine.renew_leases() == set()  # the heartbeat renews it while it waits
    assert local.get(0.1) == Work(sleeper)
    claimed = local.take_claim(sleeper)
    assert claimed is not None and local.take_claim(sleeper) is None
    assert engine.run_turn(sleeper, claimed=claimed) == "completed"
    assert row(sleeper)["owner_epoch"] == epoch and engine.held() == {}


@postgres_only
def test_a_claim_lost_while_it_waited_is_not_driven() -> None:
    """Its lease ran out (a stalled process) and another worker took the run over: the
    heartbeat finds the other epoch, and the thread that takes the old claim drops it."""
    run = client.start("tests.sleepy", kwargs={"seconds": 60}).run_id
    engine, local = make_engine(), LocalDispatcher()
    tick(local, own_threads=OwnThreads(engine, local, 100))
    WorkflowRun.objects.filter(pk=run).update(lease_expires_at=timezone.now() - timedelta(minutes=5))
    assert make_engine().run_turn(run) == "parked"  # the takeover
    parked = row(run)
    assert engine.renew_leases() == {run}
    claimed = local.take_claim(run)
    assert claimed is not None
    assert engine.run_turn(run, claimed=claimed) == "deposed"
    # Not driven at all: its first activity did not run again.
    assert SideEffect.objects.filter(key="sleepy:before").count() == 1
    assert row(run) == parked and engine.held() == {}


def test_a_claims_clock_moves_on_by_the_time_it_waited() -> None:
    """A turn's clock (timer fire times, ``ctx.now()``) starts at the claim's database
    time: a claim that waited in the queue is read as of when its thread took it."""
    local = LocalDispatcher()
    engine = make_engine()
    run = client.start("tests.echo").run_id
    claimed = DjangoStore().turns.claim(run, "someone", 30.0, 1.0)
    assert claimed is not None
    local.dispatch_turn(run)  # a doorbell already queued: the claim rides with it
    local.dispatch_claimed(claimed)
    assert local.qsize() == 1
    time.sleep(0.2)
    taken = local.take_claim(run)
    assert taken is not None and taken.db_now - claimed.db_now >= timedelta(seconds=0.2)
    assert engine.held() == {}  # queued by hand here: only OwnThreads.hand holds it


def test_a_claim_for_a_run_whose_turn_a_thread_took_goes_to_that_thread() -> None:
    """The thread took the run's doorbell and is claiming it while the sweep's claim holds
    the row: its claim fails, and it drives the sweep's claim at once, in the place its
    turn had in the queue, instead of the claim going to the back of the queue."""
    local = LocalDispatcher()
    run = client.start("tests.echo").run_id
    claimed = DjangoStore().turns.claim(run, "someone", 30.0, 1.0)
    assert claimed is not None
    local.dispatch_turn(run)
    local.dispatch_turn("later")
    assert local.get(0.1) == Work(run) and local.take_claim(run) is None  # in the thread's hands
    assert local.dispatch_claimed(claimed) and local.qsize() == 1  # not queued again
    settled = local.settle(run)
    assert settled is not None and settled.epoch == claimed.epoch
    assert local.settle(run) is None
    # Settled, a later claim is queued as usual.
    assert local.dispatch_claimed(claimed) and local.qsize() == 2


@postgres_only
def test_a_stopping_worker_releases_the_claims_still_queued() -> None:
    runs = [client.start("tests.echo", args=[index]).run_id for index in range(3)]
    worker = InProcessWorker(threads=0, sweep=False)
    try:
        tick(worker.dispatcher, own_threads=OwnThreads(worker.engine, worker.dispatcher, 100))
        assert set(worker.engine.held()) == set(runs)
        assert sorted(worker.stop(timeout=1.0)) == sorted(runs)
        assert worker.engine.held() == {}  # the heartbeat has nothing left to renew
    finally:
        worker.dispatcher.wake()
    for run in runs:
        assert row(run)["owner_id"] is None and row(run)["status"] == "running"
        assert make_engine().run_turn(run) == "completed"


@postgres_only
def test_a_claim_whose_lease_was_not_renewed_in_time_is_released_not_driven() -> None:
    """No heartbeat renewed it for longer than the lease: another worker may have taken
    it over without this process knowing, so the thread drops the claim, releases the
    run if it still is ours, and runs none of its code."""
    config = dataclasses.replace(weft_settings.engine_config(), lease_ttl=0.3)
    engine = Engine(DjangoStore().turns, CurrentDispatcher(), lambda: config)
    local = LocalDispatcher()
    run = client.start("tests.sleepy", kwargs={"seconds": 60}).run_id
    tick(local, own_threads=OwnThreads(engine, local, 100))
    epoch = row(run)["owner_epoch"]
    time.sleep(0.4)
    assert engine.run_turn(run, claimed=local.take_claim(run)) == "deposed"
    assert not SideEffect.objects.filter(key="sleepy:before").exists()
    assert row(run)["owner_id"] is None and row(run)["owner_epoch"] == epoch and engine.held() == {}
    # Renewed in time, the same wait is fine.
    tick(local, own_threads=OwnThreads(engine, local, 100))
    time.sleep(0.2)
    assert engine.renew_leases() == set()
    time.sleep(0.2)
    assert engine.run_turn(run, claimed=local.take_claim(run)) == "parked"


@postgres_only
def test_claims_made_once_the_worker_stops_taking_them_are_released_at_once() -> None:
    """A sweep under way when the worker stops: what it claims after the queue closed is
    released by the sweep itself, never left owned by a process that is going away."""
    runs = [client.start("tests.echo", args=[index]).run_id for index in range(2)]
    engine, local = make_engine(), LocalDispatcher()
    local.close()
    report = tick(local, own_threads=OwnThreads(engine, local, 100))
    assert report.claimed == 2 and local.qsize() == 0 and engine.held() == {}
    for run in runs:
        assert row(run)["owner_id"] is None and row(run)["owner_epoch"] == 1
        assert make_engine().run_turn(run) == "completed"


@postgres_only
def test_weft_worker_threads_drive_the_runs_its_sweep_claimed(monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end in one process: runs started before the worker (no doorbell rang) are
    found by its sweep, claimed there (no thread claims them again: one epoch each) and
    completed by its threads."""
    runs = [client.start("tests.echo", args=[index]).run_id for index in range(4)]
    worker = InProcessWorker(threads=2)
    own_claims = []
    claim = worker.engine.store.claim

    def counted(run_id: str, *args: Any, **kwargs: Any) -> Any:
        own_claims.append(run_id)
        return claim(run_id, *args, **kwargs)

    monkeypatch.setattr(worker.engine.store, "claim", counted)
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while WorkflowRun.objects.filter(pk__in=runs, status="completed").count() < len(runs):
            assert time.monotonic() < deadline, "the runs were not completed"
            time.sleep(0.05)
    finally:
        worker.stop(timeout=5)
    assert not set(own_claims) & set(runs)  # the sweep claimed all four (two per thread)
    assert all(row(run)["owner_epoch"] == 1 for run in runs)


@postgres_only
def test_claims_no_thread_took_in_time_are_let_go_in_their_place() -> None:
    """Threads held up by long turns: the runs claimed for them and still waiting are
    released by the next sweep (their leases no longer renewed for nothing), with their
    ``ready_at`` kept, so any worker takes them in the order they had."""
    runs = [client.start("tests.echo", args=[index]).run_id for index in range(3)]
    ready = {run: row(run)["ready_at"] for run in runs}
    worker = InProcessWorker(threads=0, sweep=False)
    try:
        tick(worker.dispatcher, own_threads=OwnThreads(worker.engine, worker.dispatcher, 100))
        assert set(worker.engine.held()) == set(runs)
        assert worker.dispatcher.get(0.1) == Work(runs[0])  # a thread took the first one's turn
        worker._let_go_waiting_claims(longest=60.0)
        assert set(worker.engine.held()) == set(runs)  # none waited that long
        worker._let_go_waiting_claims(longest=0.0)
        # The taken one is the thread's to settle; the others are released in their place.
        assert set(worker.engine.held()) == {runs[0]}
        for run in runs[1:]:
            after = row(run)
            assert after["owner_id"] is None and after["dispatched_at"] is None
            assert after["ready_at"] == ready[run]
        sent = DjangoStore().sweep.claim_dispatch_batch(100, 0.0, 0.5)
        assert sent.runnable == runs[1:]
        # Their turns stay queued: a thread that gets to one claims the run as any turn does.
        assert worker.dispatcher.take_claim(runs[1]) is None
        assert make_engine().run_turn(runs[1]) == "completed"
    finally:
        worker.stop(timeout=1.0)
        worker.dispatcher.wake()


@postgres_only
def test_a_stopping_worker_gives_its_queued_claims_back_in_their_place() -> None:
    runs = [client.start("tests.echo", args=[index]).run_id for index in range(2)]
    ready = {run: row(run)["ready_at"] for run in runs}
    worker = InProcessWorker(threads=0, sweep=False)
    try:
        tick(worker.dispatcher, own_threads=OwnThreads(worker.engine, worker.dispatcher, 100))
        assert sorted(worker.stop(timeout=1.0)) == sorted(runs)
    finally:
        worker.dispatcher.wake()
    assert {run: row(run)["ready_at"] for run in runs} == ready


@postgres_only
def test_a_claims_lease_counts_from_before_the_claim_was_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's transaction went on after the claim's UPDATE (the histories, the
    commit): the lease began before the engine held the run, and it is trusted only for
    ``lease_ttl`` from then."""
    from django_weft.store.sweep import Sweep

    config = dataclasses.replace(weft_settings.engine_config(), lease_ttl=0.4)
    engine = Engine(DjangoStore().turns, CurrentDispatcher(), lambda: config)
    local = LocalDispatcher()
    run = client.start("tests.sleepy", kwargs={"seconds": 60}).run_id
    claim_locked = Sweep._claim_locked

    def slow(self: Sweep, *args: Any, **kwargs: Any) -> Any:
        claimed = claim_locked(self, *args, **kwargs)
        time.sleep(0.25)  # a slow history read
        return claimed

    monkeypatch.setattr(Sweep, "_claim_locked", slow)
    tick(local, own_threads=OwnThreads(engine, local, 100))
    time.sleep(0.2)  # 0.45 s since the claim, 0.2 s since the run was held
    assert engine.run_turn(run, claimed=local.take_claim(run)) == "deposed"
    assert not SideEffect.objects.filter(key="sleepy:before").exists()


@postgres_only
def test_a_claim_for_a_turn_thread_that_dies_is_released(monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn that ends its thread (``SystemExit`` from workflow code): a claim the sweep
    made for that run meanwhile is let go, not held and renewed with no thread to drive it."""
    run = client.start("tests.echo", args=[1]).run_id
    worker = InProcessWorker(threads=0, sweep=False)
    worker.dispatcher.dispatch_turn(run)

    def dies(work: Work, claimed: Any = None) -> None:
        # The sweep claims the run while this thread has its turn: the claim waits for it.
        report = tick(worker.dispatcher, own_threads=OwnThreads(worker.engine, worker.dispatcher, 100))
        assert report.claimed == 1
        raise SystemExit

    monkeypatch.setattr(worker, "_work", dies)
    try:
        with pytest.raises(SystemExit):
            worker._turn_loop()
        assert worker.engine.held() == {}
        assert row(run)["owner_id"] is None
    finally:
        worker.stop(timeout=1.0)
        worker.dispatcher.wake()
    assert make_engine().run_turn(run) == "completed"


@postgres_only
def test_a_claim_whose_renewal_skipped_its_locked_row_is_not_trusted_for_longer() -> None:
    """Another transaction held the run's row while the heartbeat ran: its lease was not
    extended, so the claim counts from when it was made, not from that renewal."""
    import psycopg

    config = dataclasses.replace(weft_settings.engine_config(), lease_ttl=0.4)
    engine = Engine(DjangoStore().turns, CurrentDispatcher(), lambda: config)
    local = LocalDispatcher()
    run = client.start("tests.sleepy", kwargs={"seconds": 60}).run_id
    tick(local, own_threads=OwnThreads(engine, local, 100))
    time.sleep(0.25)
    params = dict(connection.get_connection_params())
    params.pop("cursor_factory", None)
    with psycopg.connect(**params) as elsewhere:
        elsewhere.execute("SELECT 1 FROM django_weft_workflowrun WHERE id = %s FOR UPDATE", [run])
        assert engine.renew_leases() == set()  # not lost: skipped
        elsewhere.rollback()
    time.sleep(0.2)  # 0.45 s since the claim, 0.2 s since the renewal that skipped it
    assert engine.run_turn(run, claimed=local.take_claim(run)) == "deposed"
    assert not SideEffect.objects.filter(key="sleepy:before").exists()
