"""The rate limit statement and the activity slots, on the database (PostgreSQL and
SQLite): under real threads the bucket never lets more than its limit go in a window of
its period, the statement does the engine's arithmetic, slots are counted under their
key's lock, and a slot whose lease runs out is free."""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_weft import Concurrency, client
from django_weft.engine import clock
from django_weft.engine.flow import Hold, HoldKind, Rate, SlotTaken, gcra_take, to_micros
from django_weft.models import ActivitySlot, RateLimitBucket, Step, WorkflowRun
from django_weft.store import DjangoStore, activity_flow
from django_weft.store.activity_flow import ActivityFlow
from django_weft.store.attempts import Held
from django_weft.testing import make_engine
from tests.support.threads import in_threads

pytestmark = pytest.mark.django_db(transaction=True)


def sliding_window_peak(moments: list[datetime], per: float) -> int:
    """The most moments any half-open window ``[t, t + per)`` holds."""
    ordered = sorted(moments)
    peak, first = 0, 0
    for last, moment in enumerate(ordered):
        while (moment - ordered[first]).total_seconds() >= per:
            first += 1
        peak = max(peak, last - first + 1)
    return peak


def test_threads_taking_moments_at_once_never_get_more_than_the_limit_in_a_window() -> None:
    rate = Rate(50, 1.0)
    threads, takes = 8, 20
    barrier = threading.Barrier(threads)

    def take(_: int) -> list[tuple[datetime, datetime]]:
        store = DjangoStore()
        barrier.wait()
        return [store.activity_flow.grant("threads", "", rate) for _ in range(takes)]

    granted = [pair for taken in in_threads(take, threads) for pair in taken]
    moments = [moment for moment, _ in granted]
    went_now = [(moment, now) for moment, now in granted if moment <= now]
    assert len(moments) == threads * takes
    # Every attempt got a moment of its own, one interval after the one before it: the
    # 160 attempts that came at once are spread over 3.2 s, 50 to a second at most.
    ordered = sorted(moments)
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(ordered)]
    assert min(gaps) >= 0.02, min(gaps)
    assert sliding_window_peak(moments, rate.per) <= rate.limit
    # The first went at once (the bucket was new); the others, coming while the bucket
    # was taken up to a later moment, were given moments of their own.
    assert 1 <= len(went_now) < 10
    (bucket,) = RateLimitBucket.objects.filter(name="threads")
    assert bucket.tat == to_micros(ordered[-1]) + rate.interval_us


@pytest.fixture
def virtual_clock() -> Iterator[clock.VirtualClock]:
    installed = clock.VirtualClock(datetime(2030, 1, 1, tzinfo=UTC))
    clock.install(installed)
    yield installed
    clock.uninstall(installed)


def test_the_statement_does_the_engines_arithmetic(virtual_clock: clock.VirtualClock) -> None:
    store = DjangoStore()
    rate = Rate(4, 2.0)  # one every 500 ms
    tat: int | None = None
    for step in [0, 0, 0, 0.1, 0.7, 3.0, 0, 0.25, 10.0]:
        now = virtual_clock.advance(step)
        tat, expected = gcra_take(tat, to_micros(now), rate)
        moment, seen_now = store.activity_flow.grant("arithmetic", "k", rate)
        assert (to_micros(moment), seen_now) == (expected, now)
        assert RateLimitBucket.objects.get(name="arithmetic", key="k").tat == tat
        taken = store.activity_flow.take_moment("arithmetic", "other-key", rate)
        assert taken is None or taken > now  # None: it goes now


def test_names_and_keys_have_buckets_of_their_own(virtual_clock: clock.VirtualClock) -> None:
    flow = DjangoStore().activity_flow
    rate = Rate(1, 10.0)
    assert flow.take_moment("stripe", "", rate) is None
    assert flow.take_moment("stripe", "", rate) == virtual_clock.now() + timedelta(seconds=10)
    assert flow.take_moment("stripe", "acct-1", rate) is None
    assert flow.take_moment("mail", "", rate) is None
    assert RateLimitBucket.objects.count() == 3


def test_idle_buckets_are_forgotten_and_the_next_attempt_goes_as_it_would_have(
    virtual_clock: clock.VirtualClock,
) -> None:
    flow = DjangoStore().activity_flow
    rate = Rate(1, 10.0)
    assert flow.take_moment("idle", "", rate) is None  # its next moment: 10 s from now
    virtual_clock.advance(3600 + 15)
    assert flow.take_moment("busy", "", rate) is None
    assert flow.forget_idle_buckets(3600) == 1
    assert list(RateLimitBucket.objects.values_list("name", flat=True)) == ["busy"]
    assert flow.take_moment("idle", "", rate) is None  # as it would have with the old row


def test_slots_are_taken_queued_in_order_handed_on_and_freed_by_their_lease() -> None:
    runs = [client.start("tests.echo").run_id for _ in range(4)]
    flow = DjangoStore().activity_flow
    assert flow.take_slot("act", "k", 2, runs[0], 1, 30, "h0").held
    assert flow.take_slot("act", "k", 2, runs[1], 1, 30, "h1").held
    third = flow.take_slot("act", "k", 2, runs[2], 1, 30, "h2")
    assert (third.held, third.in_use) == (False, 2)
    assert not flow.take_slot("act", "k", 2, runs[3], 1, 30, "h3").held
    # Asking again keeps its place in the queue; another key has its own slots.
    assert not flow.take_slot("act", "k", 2, runs[2], 1, 30, "h2").held
    assert flow.take_slot("act", "other", 2, runs[3], 2, 30, "o3").held
    # A release hands the slot to the attempt queued first.
    flow.release_slot("act", "k", 2, runs[0], 1, 30, "h0")
    assert flow.slot_held(runs[2], 1) and not flow.slot_held(runs[3], 1)
    assert flow.take_slot("act", "k", 2, runs[2], 1, 30, "h2").held
    # A slot whose lease ran out (its worker died) is free, and the sweep hands it on.
    ActivitySlot.objects.filter(run_id=runs[1], seq=1).update(lease_expires_at=datetime.now(UTC))
    assert flow.hand_on_waiting({"act": Concurrency(limit=2)}, 30, 10) == []  # the runs are not waiting on it
    assert flow.slot_held(runs[3], 1)
    rows = ActivitySlot.objects.filter(key="k").values_list("run_id", "state")
    assert sorted((str(run), state) for run, state in rows) == sorted([(runs[2], "held"), (runs[3], "held")])


def test_a_running_attempts_slot_is_renewed_with_its_workers_leases() -> None:
    run_id = client.start("tests.echo").run_id
    flow = DjangoStore().activity_flow
    assert flow.take_slot("act", "", 1, run_id, 0, 0.5, "mine").held
    engine = make_engine()
    with engine.holding_slot(run_id, 0, "mine"):
        before = ActivitySlot.objects.get(run_id=run_id).lease_expires_at
        time.sleep(0.05)
        engine.renew_leases()
        after = ActivitySlot.objects.get(run_id=run_id).lease_expires_at
        assert after > before + timedelta(seconds=2)  # WEFT_LEASE_TTL (3 s in the tests) from now
    time.sleep(0.05)
    engine.renew_leases()  # no longer held here: not renewed
    assert ActivitySlot.objects.get(run_id=run_id).lease_expires_at == after


def test_a_slot_is_renewed_and_given_back_only_by_the_execution_holding_it() -> None:
    runs = [client.start("tests.echo").run_id for _ in range(2)]
    flow = DjangoStore().activity_flow
    assert flow.take_slot("act", "", 1, runs[0], 0, 30, "earlier").held
    # Another execution of the same attempt (its run was taken over) does not share the
    # slot the earlier one still holds: it waits, without a place of its own.
    again = flow.take_slot("act", "", 1, runs[0], 0, 30, "later")
    assert (again.held, again.in_use) == (False, 1)
    assert ActivitySlot.objects.get(run_id=runs[0]).holder == "earlier"
    # The earlier execution's lease ran out (its worker stalled): the later one takes it.
    ActivitySlot.objects.filter(run_id=runs[0]).update(lease_expires_at=datetime.now(UTC))
    assert flow.take_slot("act", "", 1, runs[0], 0, 30, "later").held
    taken = ActivitySlot.objects.get(run_id=runs[0])
    # The earlier execution ends late: its renewal and its release leave the slot alone.
    flow.renew_slots([(runs[0], 0, "earlier")], 300)
    assert flow.release_slot("act", "", 1, runs[0], 0, 30, "earlier") == []
    assert ActivitySlot.objects.get(run_id=runs[0]).lease_expires_at == taken.lease_expires_at
    assert not flow.take_slot("act", "", 1, runs[1], 0, 30, "other").held  # still one in use
    # Giving up a place in the queue leaves a held slot alone; its holder's release frees it.
    flow.release_slot("act", "", 1, runs[0], 0, 30, None)
    assert ActivitySlot.objects.get(run_id=runs[0]).holder == "later"
    flow.release_slot("act", "", 1, runs[0], 0, 30, "later")
    # Handed on to the attempt queued: any execution of it takes it up, once.
    handed = ActivitySlot.objects.get(run_id=runs[1])
    assert (handed.state, handed.holder) == ("held", "")
    assert flow.take_slot("act", "", 1, runs[1], 0, 30, "runs-it").held
    assert not flow.take_slot("act", "", 1, runs[1], 0, 30, "another").held


# SQLite's slot decisions hold the write lock, so no worker can write in between there.
@pytest.mark.postgres
def test_a_handed_slot_taken_up_by_a_worker_meanwhile_is_not_taken_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, queued, last = (client.start("tests.echo").run_id for _ in range(3))
    flow = DjangoStore().activity_flow
    assert flow.take_slot("act", "", 1, first, 0, 30, "first").held
    assert not flow.take_slot("act", "", 1, queued, 5, 30, "queued").held
    flow.release_slot("act", "", 1, first, 0, 30, "first")  # handed to (queued, 5)
    look = ActivityFlow._look

    def worker_takes_it_up_meanwhile(self: ActivityFlow, *args: Any) -> Any:
        found = look(self, *args)
        # A worker holding the queued attempt takes the handed slot up, without the
        # group's lock (ActivityAttempts.hold_activity), between this read and its write.
        taken = threading.Thread(
            target=lambda: [
                ActivitySlot.objects.filter(run_id=queued, holder="").update(holder="worker"),
                connections.close_all(),
            ]
        )
        taken.start()
        taken.join()
        return found

    monkeypatch.setattr(ActivityFlow, "_look", worker_takes_it_up_meanwhile)
    assert not flow.take_slot("act", "", 1, queued, 5, 30, "another").held
    monkeypatch.setattr(ActivityFlow, "_look", look)
    assert ActivitySlot.objects.get(run_id=queued).holder == "worker"
    assert not flow.take_slot("act", "", 1, last, 0, 30, "last").held  # the limit counts it once


@pytest.mark.postgres
def test_on_postgresql_a_free_slot_is_taken_and_given_back_in_one_statement_each() -> None:
    runs = [client.start("tests.echo").run_id for _ in range(3)]
    flow = DjangoStore().activity_flow
    assert flow._has_slot_functions()  # asked once for this connection, before the counts
    session_setting = synchronous_commit()
    with CaptureQueriesContext(connection) as taken:
        assert flow.take_slot("act", "k", 2, runs[0], 0, 30, "h0") == SlotTaken(held=True, in_use=1)
    with CaptureQueriesContext(connection) as second:
        assert flow.take_slot("act", "k", 2, runs[1], 0, 30, "h1") == SlotTaken(held=True, in_use=2)
    assert [len(taken), len(second)] == [1, 1], taken.captured_queries
    slot = ActivitySlot.objects.get(run_id=runs[0])
    assert (slot.activity, slot.key, slot.state, slot.holder) == ("act", "k", "held", "h0")
    assert slot.lease_expires_at - slot.created_at == timedelta(seconds=30)
    with CaptureQueriesContext(connection) as given_back:
        assert flow.release_slot("act", "k", 2, runs[0], 0, 30, "h0") == []
    assert len(given_back) == 1, given_back.captured_queries
    assert not ActivitySlot.objects.filter(run_id=runs[0]).exists()
    # In a transaction of its own it commits without waiting for the flush, for that
    # transaction only; inside the caller's transaction it leaves its commit as it was.
    assert given_back.captured_queries[0]["sql"].endswith("true::boolean)")
    assert synchronous_commit() == session_setting
    with transaction.atomic():
        assert flow.take_slot("act", "k", 2, runs[0], 0, 30, "h0").held
        flow.release_slot("act", "k", 2, runs[0], 0, 30, "h0")
        assert synchronous_commit() == session_setting
    # At the limit, the function leaves the decision to the lock's longer path: queued.
    assert flow.take_slot("act", "k", 2, runs[0], 0, 30, "h0").held
    with CaptureQueriesContext(connection) as queued:
        assert flow.take_slot("act", "k", 2, runs[2], 0, 30, "h2") == SlotTaken(held=False, in_use=2)
    assert len(queued) > 1
    assert ActivitySlot.objects.get(run_id=runs[2]).state == "waiting"
    # With an attempt waiting, a slot given back is handed on to it, and its run is woken.
    flow.release_slot("act", "k", 2, runs[1], 0, 30, "h1")
    assert flow.slot_held(runs[2], 0)


def synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


def test_a_free_slot_goes_to_the_attempt_waiting_for_one_not_to_a_newcomer() -> None:
    runs = [client.start("tests.echo").run_id for _ in range(4)]
    flow = DjangoStore().activity_flow
    assert flow.take_slot("act", "", 2, runs[0], 0, 30, "h0").held
    assert flow.take_slot("act", "", 2, runs[1], 0, 30, "h1").held
    assert not flow.take_slot("act", "", 2, runs[2], 0, 30, "h2").held  # waits for one
    # A slot is free (its lease ran out) but an attempt of a live run waits: a newcomer
    # queues behind it, and the slot goes to the one that waited.
    ActivitySlot.objects.filter(run_id=runs[1]).update(lease_expires_at=datetime.now(UTC))
    assert flow.take_slot("act", "", 2, runs[3], 0, 30, "h3") == SlotTaken(held=False, in_use=1)
    assert ActivitySlot.objects.get(run_id=runs[3]).state == "waiting"
    assert flow.take_slot("act", "", 2, runs[2], 0, 30, "h2").held


@pytest.mark.postgres
def test_without_the_slot_functions_slots_are_decided_as_before(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runs = [client.start("tests.echo").run_id for _ in range(2)]
    with connection.cursor() as cursor:
        cursor.execute("ALTER FUNCTION weft_take_free_slot RENAME TO weft_take_free_slot_gone")
    try:
        flow = DjangoStore().activity_flow
        monkeypatch.setattr(activity_flow, "_HAS_SLOT_FUNCTIONS", weakref.WeakSet())
        monkeypatch.setattr(activity_flow, "_WARNED", weakref.WeakSet())
        with caplog.at_level("WARNING", logger="django_weft.store"):
            assert not flow._has_slot_functions()
            assert flow.take_slot("act", "", 1, runs[0], 0, 30, "h0").held
            assert not flow.take_slot("act", "", 1, runs[1], 0, 30, "h1").held
            flow.release_slot("act", "", 1, runs[0], 0, 30, "h0")
            assert flow.slot_held(runs[1], 0)
        missing = [r for r in caplog.records if "functions of migration 0029 are missing" in r.getMessage()]
        assert len(missing) == 1  # once per connection, not once per decision
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER FUNCTION weft_take_free_slot_gone RENAME TO weft_take_free_slot")


@pytest.mark.postgres
def test_a_slot_given_back_whose_hand_on_fails_is_free_and_the_sweep_hands_it_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runs = [client.start("tests.echo").run_id for _ in range(2)]
    flow = DjangoStore().activity_flow
    assert flow.take_slot("act", "", 1, runs[0], 0, 30, "h0").held
    assert not flow.take_slot("act", "", 1, runs[1], 0, 30, "h1").held  # waits for it

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("server closed the connection unexpectedly")

    with monkeypatch.context() as patched, caplog.at_level("WARNING", logger="django_weft.store"):
        patched.setattr(ActivityFlow, "_hand_on", unreachable)
        # In the caller's transaction nothing is given back until it commits: the caller
        # hears of the failure, and the slot stays held.
        with pytest.raises(OperationalError), transaction.atomic():
            flow.release_slot("act", "", 1, runs[0], 0, 30, "h0")
        assert ActivitySlot.objects.get(run_id=runs[0]).state == "held"
        assert flow.release_slot("act", "", 1, runs[0], 0, 30, "h0") == []
    (record,) = [r for r in caplog.records if "concurrency slot" in r.getMessage()]
    assert "gave back the concurrency slot of activity act but could not hand it on" in record.getMessage()
    assert not ActivitySlot.objects.filter(run_id=runs[0]).exists()
    assert ActivitySlot.objects.get(run_id=runs[1]).state == "waiting"
    assert flow.hand_on_waiting({"act": Concurrency(limit=1)}, 30, 10) == []  # tests.echo is not parked on it
    assert flow.slot_held(runs[1], 0)


@pytest.mark.postgres
def test_a_handed_slot_whose_lease_ran_out_while_its_hold_waited_for_the_run_is_not_taken_up() -> None:
    run_id = client.start("tests.echo").run_id
    Step.objects.create(
        run_id=run_id,
        seq=0,
        kind="activity",
        name="act",
        status="started",
        attempt=1,
        args={},
        started_at=datetime.now(UTC),
    )
    # Handed on to the attempt, with a lease that runs out while the hold below waits for
    # the run's row, which another transaction holds.
    ActivitySlot.objects.create(
        activity="act", key="", run_id=run_id, seq=0, state="held", holder="",
        lease_expires_at=datetime.now(UTC) + timedelta(seconds=0.3), created_at=datetime.now(UTC),
    )  # fmt: skip
    locked = threading.Event()

    def hold_the_run(_: int) -> None:
        with transaction.atomic():
            WorkflowRun.objects.select_for_update().get(pk=run_id)
            locked.set()
            time.sleep(0.6)

    holder = threading.Thread(target=lambda: in_threads(hold_the_run, 1))
    holder.start()
    assert locked.wait(10)
    hold = Hold(HoldKind.CONCURRENCY, "act", datetime.now(UTC) + timedelta(seconds=30), limit=1, in_use=1)
    assert DjangoStore().attempts.hold_activity(run_id, 0, 1, hold, holder="late") == Held.HELD
    holder.join(10)
    assert ActivitySlot.objects.get(run_id=run_id).holder == ""  # not taken up
    assert Step.objects.get(run_id=run_id, seq=0).status == "delayed"


def test_threads_taking_and_giving_back_slots_never_hold_more_than_the_limit() -> None:
    limit, threads, rounds = 3, 8, 15
    runs = [client.start("tests.echo").run_id for _ in range(threads)]
    lock = threading.Lock()
    holding, peak, held_rows, refused = [0], [0], [0], [0]
    barrier = threading.Barrier(threads)

    def work(n: int) -> int:
        flow, run_id, taken = DjangoStore().activity_flow, runs[n], 0
        barrier.wait()
        for seq in range(rounds):
            holder = f"t{n}-{seq}"
            while not flow.take_slot("busy", "", limit, run_id, seq, 30, holder).held:
                flow.release_slot("busy", "", limit, run_id, seq, 30, None)  # gives its place up
                with lock:
                    refused[0] += 1
                time.sleep(0.001)
            taken += 1
            with lock:
                holding[0] += 1
                peak[0] = max(peak[0], holding[0])
            rows = ActivitySlot.objects.filter(activity="busy", state="held").count()
            with lock:
                held_rows[0] = max(held_rows[0], rows)
            time.sleep(0.002)
            with lock:
                holding[0] -= 1
            flow.release_slot("busy", "", limit, run_id, seq, 30, holder)
        return taken

    assert sum(in_threads(work, threads, timeout=120)) == threads * rounds
    # Never more executions at once than the limit, by this process's count or by the
    # table's; and the threads did contend for the slots.
    assert peak[0] <= limit and held_rows[0] <= limit
    assert refused[0] > 0
    assert not ActivitySlot.objects.exists()
