"""Flow control of activity attempts through the engine and the workers' path, on both
databases: an attempt over its rate limit or without a concurrency slot waits without a
thread (an inline one parks its run, a queued one is sent again by its run), runs once,
uses up no attempt, and leaves the history a run never held would have recorded."""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import pytest
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from django_weft import client
from django_weft.engine import clock
from django_weft.engine.attempt import AttemptFlow
from django_weft.engine.flow import Rate
from django_weft.engine.registry import registry
from django_weft.models import ActivitySlot, RateLimitBucket, Step, Timer, WorkflowRun
from django_weft.runtime import ActivityOutcome, export_history, run_activity, tick, worker
from django_weft.runtime.dispatch import LocalDispatcher, SweepOnlyDispatcher
from django_weft.store import DjangoStore
from django_weft.testing import drive, make_engine
from django_weft.testing.replay import assert_replays
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

HELD_BY_RATE = re.compile(r"^delayed by rate limit tests\.paced until \d\d:\d\d:\d\d\.\d{3}$")
PACED = Rate(5, 1.0)


def turn(run_id: str) -> str:
    return str(make_engine().run_turn(run_id))


def row(run_id: str) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=run_id)


def step(run_id: str, seq: int = 0) -> Step:
    return Step.objects.get(run_id=run_id, seq=seq)


def ran(key: str) -> list[datetime]:
    return list(
        SideEffect.objects.filter(key=key).order_by("created_at").values_list("created_at", flat=True)
    )


def until(run_id: str, seq: int = 0) -> datetime:
    return datetime.fromisoformat(step(run_id, seq).result["until"])


def sleep_until(moment: datetime) -> None:
    time.sleep(max((moment - timezone.now()).total_seconds(), 0) + 0.01)


@contextmanager
def seen_at(moment: datetime) -> Iterator[None]:
    """The engine and the store see ``moment`` as now: a turn that stands for a worker
    coming that long after a moment, however slowly this machine runs it."""
    frozen = clock.VirtualClock(moment)
    clock.install(frozen)
    try:
        yield
    finally:
        clock.uninstall(frozen)


def shape(run_id: str) -> list[tuple[int, str, str, str, int]]:
    return [
        (s["seq"], s["kind"], s["name"], s["status"], s["attempt"]) for s in export_history(run_id)["steps"]
    ]


# -- rate limits ---------------------------------------------------------------------------


def test_an_inline_attempt_over_its_rate_limit_parks_its_run_until_its_moment_and_runs_once() -> None:
    first = client.start("tests.af.one", args=["paced", "a"])
    second = client.start("tests.af.one", args=["paced", "b"])
    assert turn(first.run_id) == "completed"
    assert turn(second.run_id) == "parked"  # no thread waits: the run is parked

    parked = row(second.run_id)
    assert parked.status == "waiting" and parked.owner_id is None
    assert parked.waiting_on["kind"] == "rate_limit"
    assert HELD_BY_RATE.match(parked.waiting_on["text"]), parked.waiting_on["text"]
    held = step(second.run_id)
    assert (held.status, held.attempt, held.failed_attempts) == ("delayed", 1, None)
    assert held.result["reserved"] == held.result["until"]  # the moment it was given
    moment = until(second.run_id)
    # One interval (200 ms) after the first attempt's moment, and its timer is set for it.
    assert timedelta(0) < moment - ran("paced:a")[0] <= timedelta(milliseconds=200)
    assert Timer.objects.get(run_id=second.run_id, seq=0, fired_at__isnull=True).kind == "retry"
    assert Timer.objects.get(run_id=second.run_id, seq=0).fire_at == moment
    assert turn(second.run_id) == "not_claimed"  # not before its moment
    assert ran("paced:b") == []

    sleep_until(moment)
    with seen_at(moment + timedelta(milliseconds=10)):  # in time for its moment
        assert turn(second.run_id) == "completed"
    (executed,) = ran("paced:b")
    assert executed >= moment
    done = step(second.run_id)
    assert (done.status, done.attempt, done.result, done.failed_attempts) == ("completed", 1, "b", None)
    # It took one moment only: the bucket is one interval past the moment it was given.
    bucket = RateLimitBucket.objects.get(name="tests.paced")
    assert bucket.tat == (moment - datetime.fromtimestamp(0, moment.tzinfo)) // timedelta(microseconds=1) + (
        PACED.interval_us
    )


def test_an_attempt_too_late_for_its_moment_takes_a_new_one_behind_the_others() -> None:
    first, late, next_ = (client.start("tests.af.one", args=["paced", n]) for n in ("l1", "l2", "l3"))
    assert turn(first.run_id) == "completed"
    assert turn(late.run_id) == "parked"
    assert turn(next_.run_id) == "parked"
    given, following = until(late.run_id), until(next_.run_id)
    assert following - given == timedelta(milliseconds=200)
    # Its worker comes more than half an interval (100 ms) after its moment: started
    # now, it would run beside the attempt given the next moment. It takes a new one.
    sleep_until(given + timedelta(milliseconds=150))
    with seen_at(given + timedelta(milliseconds=150)):
        assert turn(late.run_id) == "parked"
    assert until(late.run_id) == following + timedelta(milliseconds=200)
    assert (step(late.run_id).status, step(late.run_id).attempt) == ("delayed", 1)
    assert ran("paced:l2") == []
    assert drive(next_.run_id) == "completed" and drive(late.run_id) == "completed"
    assert ran("paced:l3")[0] < ran("paced:l2")[0]
    assert (step(late.run_id).status, step(late.run_id).attempt) == ("completed", 1)


def test_a_delay_is_not_in_the_history_a_replay_reads() -> None:
    first = client.start("tests.af.two_paced", args=["x"])
    second = client.start("tests.af.two_paced", args=["y"])
    assert turn(first.run_id) == "parked"  # its second activity waits for the moment after its first
    assert turn(second.run_id) == "parked"
    assert [s.status for s in Step.objects.filter(run_id=first.run_id)] == ["completed", "delayed"]
    assert [s.status for s in Step.objects.filter(run_id=second.run_id)] == ["delayed"]
    assert_replays(export_history(first.run_id))  # a held history replays to its hold
    assert_replays(export_history(second.run_id))
    assert drive(first.run_id) == "completed" and drive(second.run_id) == "completed"
    assert first.result() == ["x-1", "x-2"] and second.result() == ["y-1", "y-2"]
    expected = [
        (0, "activity", "tests.af.paced", "completed", 1),
        (1, "activity", "tests.af.paced", "completed", 1),
    ]
    assert shape(first.run_id) == shape(second.run_id) == expected
    assert assert_replays(export_history(first.run_id)).result.end == "returned"
    assert assert_replays(export_history(second.run_id)).result.end == "returned"


def test_a_delay_uses_up_no_attempt_and_each_attempt_takes_a_moment_of_its_own() -> None:
    # Two per second; the first two attempts fail, the retry policy allows three.
    handle = client.start("tests.af.one", args=["flaky_paced", "f", 2])
    assert turn(handle.run_id) == "parked"  # attempt 1 failed; attempt 2 waits for its moment
    held = step(handle.run_id)
    assert (held.status, held.attempt, len(held.failed_attempts)) == ("delayed", 2, 1)
    assert row(handle.run_id).waiting_on["kind"] == "rate_limit"
    assert drive(handle.run_id) == "completed"
    assert handle.result() == "f"
    done = step(handle.run_id)
    assert (done.status, done.attempt) == ("completed", 3)
    assert [entry["attempt"] for entry in done.failed_attempts] == [1, 2]
    attempts = ran("flaky:f")
    assert len(attempts) == 3
    # Each attempt went at a moment of its own, an interval (500 ms) after the one before.
    assert all(
        later - earlier >= timedelta(milliseconds=450) for earlier, later in itertools.pairwise(attempts)
    )


def test_activities_naming_a_rate_limit_share_it_and_each_key_has_a_bucket_of_its_own() -> None:
    first = client.start("tests.af.one", args=["paced", "p1"])
    other = client.start("tests.af.one", args=["paced_too", "p2"])
    assert turn(first.run_id) == "completed"
    assert turn(other.run_id) == "parked"  # another activity, the same bucket
    assert row(other.run_id).waiting_on["name"] == "tests.paced"

    a1, b1, a2 = (client.start("tests.af.one", args=["per_account", n], kwargs={"account": acct})
                  for n, acct in [("1", "a"), ("1", "b"), ("2", "a")])  # fmt: skip
    assert turn(a1.run_id) == "completed"
    assert turn(b1.run_id) == "completed"  # account b has a bucket of its own
    assert turn(a2.run_id) == "parked"  # one per 10 s for account a
    assert (
        row(a2.run_id).waiting_on["text"].startswith("delayed by rate limit tests.per_account key a until ")
    )
    assert timedelta(seconds=9.5) < until(a2.run_id) - timezone.now() <= timedelta(seconds=10)


@override_settings(WEFT_RATE_LIMITS={"tests.per_account": "10/s"})
def test_weft_rate_limits_overrides_a_limit_by_name() -> None:
    first = client.start("tests.af.one", args=["per_account", "1"], kwargs={"account": "a"})
    second = client.start("tests.af.one", args=["per_account", "2"], kwargs={"account": "a"})
    assert turn(first.run_id) == "completed"
    assert turn(second.run_id) == "parked"
    # 10 per second, not the declared 1 per 10 s: 100 ms after the first.
    assert until(second.run_id) - ran("account:a:1")[0] <= timedelta(milliseconds=100)
    assert drive(second.run_id) == "completed"


def test_a_key_that_cannot_be_computed_fails_the_attempt_for_good_without_running_it() -> None:
    handle = client.start("tests.af.one", args=["bad_key", {"number": 7}])
    assert turn(handle.run_id) == "failed"
    failed = step(handle.run_id)
    assert (failed.status, failed.attempt) == ("failed", 1)
    assert "the rate limit key of activity 'tests.af.bad_key' could not be computed from the activity's " \
           "arguments: KeyError" in failed.error["message"]  # fmt: skip
    assert ran("bad_key:ran") == []
    assert not RateLimitBucket.objects.exists()


def test_a_cancellation_request_reaches_a_run_its_rate_limit_holds() -> None:
    first = client.start("tests.af.one", args=["paced", "c1"])
    second = client.start("tests.af.one", args=["paced", "c2"])
    turn(first.run_id)
    assert turn(second.run_id) == "parked"
    assert second.cancel("no longer needed", mode="request") == "running"  # the request woke it
    assert turn(second.run_id) == "cancelled"
    assert ran("paced:c2") == []
    assert not Timer.objects.filter(run_id=second.run_id, fired_at__isnull=True).exists()


def test_a_queued_attempt_held_on_its_worker_is_sent_again_by_its_run() -> None:
    handle = client.start("tests.af.fan_out", args=["q", 3])
    assert turn(handle.run_id) == "parked"
    outcomes = [run_activity(handle.run_id, seq, 1) for seq in range(3)]
    assert outcomes == [ActivityOutcome.COMPLETED, ActivityOutcome.DELAYED, ActivityOutcome.DELAYED]
    held = [step(handle.run_id, seq) for seq in (1, 2)]
    assert [(s.status, s.attempt) for s in held] == [("delayed", 1)] * 2
    assert all(s.result["reserved"] == s.result["until"] for s in held)
    moments = [until(handle.run_id, seq) for seq in (1, 2)]
    assert moments[1] - moments[0] == timedelta(milliseconds=200)
    assert timedelta(0) < moments[0] - ran("paced:q-0")[0] <= timedelta(milliseconds=200)
    # No lease or dispatch deadline runs for a held attempt: its run's retry timer wakes it.
    timers = set(Timer.objects.filter(run_id=handle.run_id).values_list("seq", "kind"))
    assert timers == {(1, "retry"), (2, "retry")}
    waiting_on = row(handle.run_id).waiting_on
    assert waiting_on["kind"] == "activities" and set(waiting_on["held"]) == {"1", "2"}
    assert all(HELD_BY_RATE.match(text) for text in waiting_on["held"].values())
    assert turn(handle.run_id) == "not_claimed"

    assert drive(handle.run_id) == "completed"  # re-sent at their moments, each run once
    assert handle.result() == ["q-0", "q-1", "q-2"]
    assert [(s.status, s.attempt) for s in Step.objects.filter(run_id=handle.run_id)] == [
        ("completed", 1)
    ] * 3
    assert ran("paced:q-1")[0] >= moments[0] and ran("paced:q-2")[0] >= moments[1]
    assert_replays(export_history(handle.run_id))


# -- activity concurrency --------------------------------------------------------------------


def _in_thread(target: object, *args: object) -> threading.Thread:
    def run() -> None:
        try:
            target(*args)  # type: ignore[operator]
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _wait_for(key: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not SideEffect.objects.filter(key=key).exists():
        assert time.monotonic() < deadline, f"{key} never happened"
        time.sleep(0.02)


def test_an_inline_attempt_waits_for_a_slot_without_a_thread_and_gets_the_next_one() -> None:
    first = client.start("tests.af.one", args=["slotted", "A"], kwargs={"account": "acct", "seconds": 1.0})
    second = client.start("tests.af.one", args=["slotted", "B"], kwargs={"account": "acct"})
    other = client.start("tests.af.one", args=["slotted", "C"], kwargs={"account": "other"})
    running = _in_thread(turn, first.run_id)
    _wait_for("begin:A")
    assert turn(second.run_id) == "parked"
    parked = row(second.run_id)
    assert (parked.status, parked.waiting_on["kind"]) == ("waiting", "activity_concurrency")
    assert (
        parked.waiting_on["text"] == "queued: activity concurrency tests.af.slotted key acct (1 of 1 in use)"
    )
    assert (step(second.run_id).status, step(second.run_id).attempt) == ("delayed", 1)
    slots = dict(ActivitySlot.objects.values_list("run_id", "state"))
    assert {str(run): state for run, state in slots.items()} == {
        first.run_id: "held",
        second.run_id: "waiting",
    }
    assert turn(other.run_id) == "completed"  # another key: slots of its own
    assert turn(second.run_id) == "not_claimed"

    running.join(10)
    assert row(first.run_id).status == "completed"
    # The freed slot was handed to the queued attempt, and its run's timer is due now.
    assert ActivitySlot.objects.get(run_id=second.run_id).state == "held"
    assert until(second.run_id) <= timezone.now()
    assert turn(second.run_id) == "completed"
    assert ran("end:A")[0] < ran("begin:B")[0]
    assert not ActivitySlot.objects.exists()
    assert (step(second.run_id).status, step(second.run_id).attempt) == ("completed", 1)


def test_a_run_that_receives_a_cancellation_request_while_queued_for_a_slot_gives_its_place_up() -> None:
    first = client.start("tests.af.one", args=["slotted", "K1"], kwargs={"account": "k", "seconds": 0.5})
    second = client.start("tests.af.one", args=["slotted", "K2"], kwargs={"account": "k"})
    running = _in_thread(turn, first.run_id)
    _wait_for("begin:K1")
    assert turn(second.run_id) == "parked"
    assert ActivitySlot.objects.get(run_id=second.run_id).state == "waiting"
    second.cancel("not needed", mode="request")
    assert turn(second.run_id) == "cancelled"
    assert not ActivitySlot.objects.filter(run_id=second.run_id).exists()
    running.join(10)
    assert row(first.run_id).status == "completed"
    assert ran("begin:K2") == [] and not ActivitySlot.objects.exists()


def _overlaps(*labels: str) -> list[tuple[str, str]]:
    """The executions of different labels that ran at the same time."""
    spans = [(label, ran(f"begin:{label}"), ran(f"end:{label}")) for label in labels]
    runs = [
        (label, begin, end) for label, begins, ends in spans for begin, end in zip(begins, ends, strict=False)
    ]
    return [
        (a, b)
        for i, (a, a0, a1) in enumerate(runs)
        for b, b0, b1 in runs[i + 1 :]
        if a != b and a0 < b1 and b0 < a1
    ]


def test_an_attempt_still_running_after_its_run_was_taken_over_keeps_its_slot_to_itself() -> None:
    first = client.start("tests.af.one", args=["slotted", "T1"], kwargs={"account": "t", "seconds": 1.0})
    second = client.start("tests.af.one", args=["slotted", "T2"], kwargs={"account": "t"})
    running = _in_thread(turn, first.run_id)
    _wait_for("begin:T1")
    # Its worker stalls: the run's lease runs out and another worker takes the run over,
    # while the attempt still executes (and holds the slot) in the first one.
    WorkflowRun.objects.filter(pk=first.run_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert turn(first.run_id) == "parked"  # the new execution waits for the earlier one
    assert step(first.run_id).status == "delayed"
    assert turn(second.run_id) == "parked"  # and the limit still counts the earlier one
    running.join(10)
    # The earlier execution's slot went to the attempt queued first, not to nobody.
    assert ActivitySlot.objects.get(run_id=second.run_id).state == "held"
    assert turn(second.run_id) == "completed"
    assert drive(first.run_id) == "completed"
    assert len(ran("begin:T1")) == 2 and _overlaps("T1", "T2") == []


def test_a_stalled_attempt_that_ends_late_does_not_free_the_slot_of_the_one_that_replaced_it() -> None:
    # The execution that replaces the stalled one runs for 2.5 s: it still holds the slot
    # when the stalled one has ended, however slowly this machine runs the test.
    first = client.start(
        "tests.af.one", args=["slotted", "S1"], kwargs={"account": "s", "seconds": 1.0, "again_seconds": 2.5}
    )
    second = client.start("tests.af.one", args=["slotted", "S2"], kwargs={"account": "s"})
    stalled = _in_thread(turn, first.run_id)
    _wait_for("begin:S1")
    # Its worker stalled long enough for the run's lease and the slot's to run out.
    WorkflowRun.objects.filter(pk=first.run_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    ActivitySlot.objects.filter(run_id=first.run_id).update(lease_expires_at=timezone.now())
    replacing = _in_thread(turn, first.run_id)
    deadline = time.monotonic() + 10
    while len(ran("begin:S1")) < 2:
        assert time.monotonic() < deadline, "the run was not taken over"
        time.sleep(0.02)
    stalled.join(10)  # the stalled execution ends and gives back what it held: nothing now
    assert ActivitySlot.objects.filter(run_id=first.run_id, state="held").exists()
    assert turn(second.run_id) == "parked"
    replacing.join(10)
    assert row(first.run_id).status == "completed"
    assert drive(second.run_id) == "completed"
    assert _overlaps("S1", "S2") == [] and not ActivitySlot.objects.exists()


def test_a_queued_attempt_waits_for_a_slot_and_is_sent_again_when_one_frees() -> None:
    first = client.start("tests.af.one", args=["slotted_queued", "QA"], kwargs={"seconds": 1.0})
    second = client.start("tests.af.one", args=["slotted_queued", "QB"])
    assert turn(first.run_id) == "parked" and turn(second.run_id) == "parked"
    running = _in_thread(run_activity, first.run_id, 0, 1)
    _wait_for("begin:QA")
    assert run_activity(second.run_id, 0, 1) == ActivityOutcome.DELAYED
    held = step(second.run_id)
    assert (held.status, held.result["kind"]) == ("delayed", "activity_concurrency")
    assert row(second.run_id).waiting_on["held"] == {
        "0": "queued: activity concurrency tests.af.slotted_queued (1 of 1 in use)"
    }

    running.join(10)
    # The slot went to the queued attempt: its run is due to send it again.
    assert ActivitySlot.objects.get(run_id=second.run_id).state == "held"
    assert turn(second.run_id) == "parked"
    assert step(second.run_id).status == "scheduled"
    assert run_activity(second.run_id, 0, 1) == ActivityOutcome.COMPLETED
    assert drive(second.run_id) == "completed" and drive(first.run_id) == "completed"
    assert ran("end:QA")[0] < ran("begin:QB")[0]
    assert not ActivitySlot.objects.exists()


def test_a_stale_execution_of_a_queued_attempt_leaves_the_current_attempts_place_alone() -> None:
    first = client.start("tests.af.one", args=["slotted_queued", "QS1"], kwargs={"seconds": 1.0})
    second = client.start("tests.af.one", args=["slotted_queued", "QS2"])
    assert turn(first.run_id) == "parked" and turn(second.run_id) == "parked"
    running = _in_thread(run_activity, first.run_id, 0, 1)
    _wait_for("begin:QS1")
    assert run_activity(second.run_id, 0, 1) == ActivityOutcome.DELAYED
    place = ActivitySlot.objects.get(run_id=second.run_id)
    # An execution of an attempt that is no longer the one its position waits on (lost
    # and sent again meanwhile; here, the one just held) comes through flow control late.
    act = registry.activities["tests.af.slotted_queued"]
    flow = AttemptFlow.of(act, ["QS2"], {}, {})
    assert flow is not None
    Step.objects.filter(run_id=second.run_id, seq=0).update(attempt=2)
    assert worker._admit(act, flow, second.run_id, 0, 1, reserved=None) is None
    assert ActivitySlot.objects.get(run_id=second.run_id) == place  # the queue keeps its place
    running.join(10)
    assert ActivitySlot.objects.get(run_id=second.run_id).state == "held"


def test_the_slot_of_a_worker_that_died_comes_free_when_its_lease_runs_out() -> None:
    dead = client.start("tests.echo")
    # A worker took the slot and died: nobody releases it, nobody renews its lease.
    assert (
        DjangoStore().activity_flow.take_slot("tests.af.slotted", "acct", 1, dead.run_id, 0, 0.5, "dead").held
    )
    waiting = client.start("tests.af.one", args=["slotted", "W"], kwargs={"account": "acct"})
    assert turn(waiting.run_id) == "parked"
    assert tick(SweepOnlyDispatcher()).handed_on == 0  # the lease still runs
    time.sleep(0.6)
    assert tick(SweepOnlyDispatcher()).handed_on == 1
    assert not ActivitySlot.objects.filter(run_id=dead.run_id).exists()
    assert turn(waiting.run_id) == "completed"


# -- weft_worker's timers ---------------------------------------------------------------------


def test_weft_workers_queue_hands_a_due_timer_out_on_time_and_before_new_work() -> None:
    local = LocalDispatcher()
    local.dispatch_turn("fresh-1")
    local.dispatch_turn("fresh-2")
    local.dispatch_turn("urgent", priority=10)
    released: list[float] = []

    def timer_thread() -> None:  # what weft_worker's timer thread does
        while not released:
            local.wait_for_due(5.0)
            local.release_due()
            if local.qsize() == 4:
                released.append(time.monotonic())

    waiting = threading.Thread(target=timer_thread)
    started = time.monotonic()
    waiting.start()
    time.sleep(0.05)
    # Rung while the timer thread sleeps: it wakes for it, not at the end of its sleep.
    local.dispatch_turn("timer", eta=timezone.now() + timedelta(milliseconds=100))
    waiting.join(5)
    assert 0.14 <= released[0] - started < 1.0
    assert [local.get(0.1).run_id for _ in range(4)] == ["urgent", "timer", "fresh-1", "fresh-2"]
