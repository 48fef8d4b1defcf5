"""Flow control decided in the database: concurrency slots per key (queue, cancel_new,
skip, cancel_running), priority, round-robin across keys, the sweep's hand-on, and
slots that survive a takeover and leave with a continue-as-new. On both databases."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from django.db.models import Count

from django_weft import ConcurrencyLimited, InvalidInput, client, runtime
from django_weft.engine.executor import Engine
from django_weft.models import WorkflowRun
from django_weft.runtime.dispatch import LocalDispatcher, Work, use_dispatcher
from django_weft.runtime.process import get_engine
from django_weft.runtime.worker import run_activity
from django_weft.store import DjangoStore
from django_weft.testing.helpers import make_engine

pytestmark = pytest.mark.django_db(transaction=True)


def run(run_id: str) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=run_id)


def turn(run_id: str, engine: Engine | None = None) -> str:
    return str((engine or get_engine()).run_turn(run_id))


def held(workflow: str) -> list[str]:
    return sorted(
        str(pk)
        for pk in WorkflowRun.objects.filter(workflow_name=workflow, slot="held")
        .exclude(status__in=["completed", "failed", "cancelled", "timed_out", "continued"])
        .values_list("pk", flat=True)
    )


def test_the_key_and_priority_are_stored_at_start() -> None:
    handle = client.start("tests.flow.per_key", args=["c-7"], priority=10)
    row = run(handle.run_id)
    assert (row.concurrency_key, row.priority, row.slot) == ("c-7", 10, "held")  # a free slot, taken
    assert run(client.start("tests.flow.one", args=["x"]).run_id).concurrency_key == ""
    assert run(client.start("tests.echo").run_id).concurrency_key is None


@pytest.mark.parametrize("priority", [101, -101, 1.5, True, "1", None])
def test_a_bad_priority_is_refused_and_nothing_is_written(priority: Any) -> None:
    with pytest.raises(InvalidInput, match=r"priority must be a whole number from -100 to 100"):
        client.start("tests.echo", priority=priority)
    assert not WorkflowRun.objects.exists()


def test_a_key_function_that_fails_refuses_the_start() -> None:
    with pytest.raises(InvalidInput, match=r"concurrency key of workflow .tests\.flow\.by_order. could not"):
        client.start("tests.flow.by_order", args=[{"lines": []}])
    with pytest.raises(InvalidInput, match="holds a control character"):
        client.start("tests.flow.per_key", args=["a\x01b"])
    with pytest.raises(
        InvalidInput, match=r"concurrency key function .* must return a str or int; it returned"
    ):
        client.start("tests.flow.by_order", args=[{"customer": None}])
    assert not WorkflowRun.objects.exists()


def test_over_the_limit_a_run_is_queued_pending_saying_why_and_let_in_when_the_slot_frees() -> None:
    first = client.start("tests.flow.per_key", args=["c-1"])
    second = client.start("tests.flow.per_key", args=["c-1"])
    other = client.start("tests.flow.per_key", args=["c-2"])
    assert turn(first.run_id) == "parked"  # holds c-1's one slot while it waits
    assert turn(second.run_id) == "not_claimed"
    queued = run(second.run_id)
    assert (queued.status, queued.slot, queued.owner_epoch) == ("pending", "queued", 0)
    assert queued.waiting_on["kind"] == "concurrency"
    assert queued.waiting_on["text"] == "queued: concurrency key c-1 (1 of 1 in use)"
    assert turn(other.run_id) == "parked"  # another key has a slot of its own
    assert held("tests.flow.per_key") == sorted([first.run_id, other.run_id])
    # A waiting run keeps its slot; a signal ends it and its slot goes to the queued run.
    first.signal("go")
    assert turn(first.run_id) == "completed"
    let_in = run(second.run_id)
    assert (let_in.status, let_in.slot, let_in.waiting_on) == ("running", "held", None)
    assert turn(second.run_id) == "parked"
    second.signal("go")
    assert turn(second.run_id) == "completed"
    assert second.result(timeout=1) == "c-1"


def test_a_start_whose_key_is_taken_is_queued_at_once_and_not_sent_to_a_worker() -> None:
    local = LocalDispatcher()
    use_dispatcher(local)
    try:
        first = client.start("tests.flow.per_key", args=["c-1"])
        second = client.start("tests.flow.per_key", args=["c-1"])
    finally:
        use_dispatcher(None)
    assert (run(second.run_id).status, run(second.run_id).slot) == ("pending", "queued")
    assert local.get(0.1).run_id == first.run_id
    assert local.get(0.1) is None  # the queued run rings no bell until it is let in


def test_a_delayed_start_takes_its_slot_when_it_is_due() -> None:
    holder = client.start("tests.flow.per_key", args=["c-1"])
    later = client.start("tests.flow.per_key", args=["c-1"], start_delay=0.2)
    assert (run(later.run_id).status, run(later.run_id).slot) == ("pending", "")  # no slot while delayed
    assert turn(holder.run_id) == "parked"
    time.sleep(0.3)
    assert turn(later.run_id) == "not_claimed"  # due, but the key's slot is taken: queued
    assert (run(later.run_id).status, run(later.run_id).slot) == ("pending", "queued")
    holder.signal("go")
    assert turn(holder.run_id) == "completed"
    assert turn(later.run_id) == "parked"


def test_a_limit_without_a_key_counts_every_run_of_the_workflow() -> None:
    runs = [client.start("tests.flow.one", args=[str(i)]) for i in range(3)]
    assert [turn(h.run_id) for h in runs] == ["parked", "not_claimed", "not_claimed"]
    assert run(runs[1].run_id).waiting_on["text"] == "queued: concurrency the workflow (1 of 1 in use)"


def test_cancel_new_refuses_the_start_and_writes_nothing() -> None:
    first = client.start("tests.flow.refuse", args=["c-1"])
    before = WorkflowRun.objects.count()
    with pytest.raises(ConcurrencyLimited) as refused:
        client.start("tests.flow.refuse", args=["c-1"])
    assert refused.value.run_id == first.run_id
    assert (refused.value.key, refused.value.limit) == ("c-1", 1)
    assert "on_limit='cancel_new'" in str(refused.value)
    assert WorkflowRun.objects.count() == before
    client.start("tests.flow.refuse", args=["c-2"])  # another key is free
    first.cancel()
    client.start("tests.flow.refuse", args=["c-1"])  # the key freed when its run ended


def test_skip_returns_the_run_holding_the_key() -> None:
    first = client.start("tests.flow.singleton", args=["c-1"])
    again = client.start("tests.flow.singleton", args=["c-1"])
    assert again.run_id == first.run_id
    assert WorkflowRun.objects.filter(workflow_name="tests.flow.singleton").count() == 1
    # signal_with_start on a singleton whose key is held signals the holder.
    sent = client.signal_with_start("tests.flow.singleton", ["c-1"], id="another-id", signal="go")
    assert sent.run_id == first.run_id
    assert turn(first.run_id) == "completed"


def test_cancel_running_cancels_the_oldest_and_starts_the_new_run() -> None:
    first = client.start("tests.flow.newest", args=["c-1"])
    assert turn(first.run_id) == "parked"
    second = client.start("tests.flow.newest", args=["c-1"])
    assert second.run_id != first.run_id
    cancelled = run(first.run_id)
    assert cancelled.status == "cancelled"
    assert "took its concurrency slot" in cancelled.error["message"]
    assert turn(second.run_id) == "parked"  # the slot it freed is the new run's


def test_queued_runs_are_let_in_by_priority_then_first_come() -> None:
    holder = client.start("tests.flow.one", args=["holder"])
    assert turn(holder.run_id) == "parked"
    waiting = [client.start("tests.flow.one", args=[f"p{p}-{i}"], priority=p) for i, p in
               enumerate([0, 10, -5, 10, 0])]  # fmt: skip
    for handle in waiting:
        assert turn(handle.run_id) == "not_claimed"
    order = []
    current = holder
    for _ in waiting:
        current.signal("go")
        assert turn(current.run_id) == "completed"
        (admitted,) = held("tests.flow.one")
        current = client.get_handle(admitted)
        assert turn(current.run_id) == "parked"
        order.append(run(current.run_id).args[0])
    assert order == ["p10-1", "p10-3", "p0-0", "p0-4", "p-5-2"]


def test_slots_go_round_robin_across_keys_under_a_workflow_limit() -> None:
    holder = client.start("tests.flow.fair", args=["h"])
    assert turn(holder.run_id) == "parked"
    many = [client.start("tests.flow.fair", args=["A"], kwargs={"n": n}) for n in range(20)]
    few = [client.start("tests.flow.fair", args=["B"], kwargs={"n": n}) for n in range(3)]
    for handle in many + few:
        assert turn(handle.run_id) == "not_claimed"
    finished: list[str] = []
    current = holder
    while True:
        current.signal("go")
        assert turn(current.run_id) == "completed"
        finished.append(run(current.run_id).args[0])
        now = held("tests.flow.fair")
        if not now:
            break
        current = client.get_handle(now[0])
        assert turn(current.run_id) == "parked"
    assert len(finished) == 24
    b_places = [place for place, key in enumerate(finished, 1) if key == "B"]
    assert max(b_places) <= 8, finished


def test_the_sweep_hands_on_a_slot_freed_by_a_cancel() -> None:
    first = client.start("tests.flow.per_key", args=["c-1"])
    second = client.start("tests.flow.per_key", args=["c-1"])
    assert turn(first.run_id) == "parked"
    assert turn(second.run_id) == "not_claimed"
    first.cancel()
    assert run(second.run_id).status == "pending"
    report = runtime.tick(LocalDispatcher())
    assert report.admitted == 1
    assert turn(second.run_id) == "parked"


def test_the_sweep_hands_on_a_freed_slot_beside_a_group_with_many_newer_queued_runs(settings: Any) -> None:
    """The backstop looks at groups, not runs: a busy group's newer queued runs do not
    fill its batch and hide a group whose slot was freed."""
    settings.WEFT_TICK_BATCH = 5
    cold = [client.start("tests.flow.per_key", args=["cold"]) for _ in range(2)]
    assert turn(cold[0].run_id) == "parked"
    hot = [client.start("tests.flow.per_key", args=["hot"]) for _ in range(7)]  # one held, six queued
    assert run(hot[-1].run_id).slot == "queued"
    cold[0].cancel()
    assert runtime.tick(LocalDispatcher()).admitted == 1
    assert run(cold[1].run_id).slot == "held"


def test_the_sweep_reaches_every_group_however_many_have_queued_runs(settings: Any) -> None:
    """More groups with queued runs than a sweep's batch: each sweep goes on from where the
    previous one stopped, so a freed slot in a middle group is handed on within a few."""
    settings.WEFT_TICK_BATCH = 2
    groups = [f"k{index}" for index in range(5)]
    first = {key: client.start("tests.flow.per_key", args=[key]) for key in groups}
    queued = {key: client.start("tests.flow.per_key", args=[key]) for key in groups}
    for key in groups:
        assert turn(first[key].run_id) == "parked" and run(queued[key].run_id).slot == "queued"
    first["k2"].cancel()
    admitted = [runtime.tick(LocalDispatcher()).admitted for _ in range(3)]
    assert sum(admitted) == 1 and run(queued["k2"].run_id).slot == "held", admitted
    assert [key for key in groups if run(queued[key].run_id).slot == "held"] == ["k2"]


def test_runs_of_a_workflow_whose_limit_a_deploy_removed_go_on_as_any_run(monkeypatch: Any) -> None:
    """Runs keep their key after the deploy: those still queued are let go by the sweep,
    and a runnable one waiting for a slot (a continued run's successor) is claimed as any
    run, instead of waiting for a slot no limit will ever give."""
    from django_weft.engine.registry import registry

    first = client.start("tests.flow.per_key", args=["c-1"], kwargs={"hold": False, "again": 1})
    assert turn(first.run_id) == "continued"
    successor = WorkflowRun.objects.filter(workflow_id=first.workflow_id).exclude(pk=first.run_id).get()
    assert (successor.status, successor.slot, successor.concurrency_key) == ("running", "", "c-1")
    holder = client.start("tests.flow.per_key", args=["c-2"])
    assert run(holder.run_id).slot == "held"
    queued = client.start("tests.flow.per_key", args=["c-2"], kwargs={"hold": False})
    assert (run(queued.run_id).status, run(queued.run_id).slot) == ("pending", "queued")
    # The deploy: the same workflow, without its limit.
    unlimited = dataclasses.replace(registry.workflows["tests.flow.per_key"], concurrency=None)
    monkeypatch.setitem(registry.workflows, "tests.flow.per_key", unlimited)
    assert runtime.tick(LocalDispatcher()).admitted == 1
    after = run(queued.run_id)
    assert (after.status, after.slot, after.concurrency_key) == ("running", "", None)
    assert turn(queued.run_id) == "completed"
    assert turn(str(successor.pk)) == "completed"
    assert run(str(successor.pk)).concurrency_key is None
    # A run that holds its slot keeps it until it ends.
    assert run(holder.run_id).slot == "held"


def test_a_slot_stays_with_its_run_across_a_takeover() -> None:
    first = client.start("tests.flow.per_key", args=["c-1"])
    assert turn(first.run_id, make_engine("dead")) == "parked"
    WorkflowRun.objects.filter(pk=first.run_id).update(
        status="running", owner_id="dead", lease_expires_at=None
    )
    WorkflowRun.objects.filter(pk=first.run_id).update(lease_expires_at="2000-01-01T00:00:00Z")
    assert turn(first.run_id, make_engine("alive")) == "parked"  # taken over, no queueing
    assert run(first.run_id).slot == "held"
    assert held("tests.flow.per_key") == [first.run_id]


def test_a_continued_run_gives_its_slot_back_and_queues_again() -> None:
    first = client.start("tests.flow.per_key", args=["c-1"], kwargs={"hold": False, "again": 1})
    waiting = client.start("tests.flow.per_key", args=["c-1"])
    assert turn(first.run_id) == "continued"
    successor = run(first.run_id).result["continued_as"]
    assert run(successor).slot == ""
    assert turn(waiting.run_id) == "parked"  # the slot went free with the continue
    assert turn(successor) == "not_claimed"
    assert run(successor).status == "pending"


def test_the_sweep_dispatches_higher_priority_first_and_the_local_queue_keeps_that_order() -> None:
    low = client.start("tests.echo", priority=-10)
    high = client.start("tests.echo", priority=50)
    plain = client.start("tests.echo")
    WorkflowRun.objects.update(dispatched_at=None)
    runnable, _, priorities, _ = DjangoStore().sweep.claim_dispatch_batch(100, 0.0, 0.5)
    assert runnable == [high.run_id, plain.run_id, low.run_id]
    assert priorities == {high.run_id: 50, low.run_id: -10}
    local = LocalDispatcher()
    local.dispatch_turn(low.run_id, priority=-10)
    local.dispatch_turn(plain.run_id)
    local.dispatch_turn(high.run_id, priority=50)
    local.dispatch_turn(plain.run_id, priority=90)  # already queued: folded into the first
    assert [local.get(0.1).run_id for _ in range(3)] == [high.run_id, plain.run_id, low.run_id]


def test_a_runs_queued_activities_and_later_turns_keep_its_priority_in_the_local_queue() -> None:
    """Not only a run's first turn: the attempt it sends and the turn that attempt's outcome
    wakes go ahead of lower-priority work that was waiting before them."""
    plain = client.start("tests.echo")
    urgent = client.start("tests.flow.ranked", args=["u"], kwargs={"steps": 1}, priority=40)
    local = LocalDispatcher()
    use_dispatcher(local)
    try:
        local.dispatch_turn(plain.run_id)
        assert turn(urgent.run_id) == "parked"  # it sent its queued activity
        attempt = local.get(0.1)
        assert attempt is not None and (attempt.run_id, attempt.seq) == (urgent.run_id, 0)
        assert attempt.attempt is not None
        run_activity(attempt.run_id, 0, attempt.attempt)  # its outcome wakes the run
        assert local.get(0.1) == Work(urgent.run_id)
        assert local.get(0.1) == Work(plain.run_id)
        assert turn(urgent.run_id) == "completed"
    finally:
        use_dispatcher(None)


def test_the_sweep_sends_a_taken_over_run_with_its_priority() -> None:
    handle = client.start("tests.flow.per_key", args=["c-1"], priority=25)
    assert turn(handle.run_id, make_engine("dead")) == "parked"
    WorkflowRun.objects.filter(pk=handle.run_id).update(
        status="running", owner_id="dead", lease_expires_at="2000-01-01T00:00:00Z", dispatched_at=None
    )
    runnable, expired, priorities, _ = DjangoStore().sweep.claim_dispatch_batch(100, 0.0, 0.5)
    assert (runnable, expired) == ([], [handle.run_id])
    assert priorities == {handle.run_id: 25}


def test_no_more_runs_than_the_limit_hold_slots_whatever_the_order_of_claims() -> None:
    handles = [client.start("tests.flow.per_key", args=[f"c-{i % 3}"]) for i in range(12)]
    for handle in handles:
        turn(handle.run_id)
    per_key = dict(
        WorkflowRun.objects.filter(slot="held").values_list("concurrency_key").annotate(n=Count("pk"))
    )
    assert per_key == {"c-0": 1, "c-1": 1, "c-2": 1}
    assert WorkflowRun.objects.filter(slot="queued", status="pending").count() == 9


def test_a_retried_run_takes_a_slot_afresh() -> None:
    failing = client.start("tests.flow.one", args=["x"])
    assert turn(failing.run_id) == "parked"
    WorkflowRun.objects.filter(pk=failing.run_id).update(status="failed", owner_id=None)
    holder = client.start("tests.flow.one", args=["holder"])
    assert turn(holder.run_id) == "parked"  # the failed run's slot is free
    runtime.retry(failing.run_id)
    assert turn(failing.run_id) == "not_claimed"  # queued behind the holder, not let in twice
    assert run(failing.run_id).slot == "queued"


def test_a_child_takes_its_parents_priority() -> None:
    parent = client.start("tests.c.parent", args=["prio"], priority=42)
    assert turn(parent.run_id) == "parked"
    (child,) = WorkflowRun.objects.filter(parent_id=parent.run_id)
    assert child.priority == 42
