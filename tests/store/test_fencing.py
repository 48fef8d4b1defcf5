"""Ownership: claims, takeover after expiry, fenced writes, lease renewal (real threads)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection

from django_weft import client
from django_weft.engine import faults
from django_weft.engine.executor import TurnOutcome
from django_weft.models import Step, WorkflowRun
from django_weft.store import DjangoStore
from django_weft.testing import make_engine
from tests.support.waiting import wait_until
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def in_thread(target: Any, name: str) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = target()
        except BaseException as exc:
            box["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread, box


@pytest.mark.postgres
def test_stalled_owner_is_taken_over_and_its_late_write_is_rejected() -> None:
    handle = client.start("tests.fence_probe", args=["fp"])
    engine_a, engine_b = make_engine("engine-A"), make_engine("engine-B")
    a_stalled, b_done = threading.Event(), threading.Event()

    def stall_a(context: dict[str, Any]) -> None:
        # Engine A has executed step 1's activity and is about to record it: freeze it
        # there (no heartbeat runs for A, so its lease runs out meanwhile).
        if context["engine"] is engine_a and context["seq"] == 1:
            a_stalled.set()
            b_done.wait(30)

    faults.arm("after_activity", stall_a)
    thread, box = in_thread(lambda: engine_a.run_turn(handle.run_id), "thread-A")
    assert a_stalled.wait(10)
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert (run.owner_id, run.owner_epoch) == ("engine-A", 1)

    # B cannot claim while A's lease is live...
    assert engine_b.run_turn(handle.run_id) == TurnOutcome.NOT_CLAIMED
    # ...and takes over once it has expired by more than the grace period.
    deadline = time.monotonic() + 15
    outcome = TurnOutcome.NOT_CLAIMED
    main_name = threading.current_thread().name
    threading.current_thread().name = "thread-B"
    try:
        while outcome == TurnOutcome.NOT_CLAIMED and time.monotonic() < deadline:
            time.sleep(0.2)
            outcome = engine_b.run_turn(handle.run_id)
    finally:
        threading.current_thread().name = main_name
    assert outcome == TurnOutcome.COMPLETED
    run.refresh_from_db()
    assert run.owner_epoch == 2 and run.status == "completed"
    steps_after_b = list(
        Step.objects.filter(run_id=handle.run_id).order_by("seq").values_list("seq", "result", "updated_at")
    )

    b_done.set()
    thread.join(10)
    assert box.get("value") == TurnOutcome.DEPOSED, box
    # A's late write left nothing: the history is exactly B's.
    steps = list(
        Step.objects.filter(run_id=handle.run_id).order_by("seq").values_list("seq", "result", "updated_at")
    )
    assert steps == steps_after_b
    assert [result for _, result, _ in steps] == ["thread-A", "thread-B", "thread-B"]
    assert handle.result() == ["thread-A", "thread-B", "thread-B"]
    # Step 1's activity ran twice (A's result was never recorded); step 0 once.
    assert SideEffect.objects.filter(key="fp:0").count() == 1
    assert SideEffect.objects.filter(key="fp:1").count() == 2


def test_two_engines_racing_to_claim_exactly_one_wins_200_times() -> None:
    store = DjangoStore()
    runs = [client.start("tests.echo", args=[i]).run_id for i in range(200)]
    wins = []
    for run_id in runs:
        barrier = threading.Barrier(2)
        results: dict[str, Any] = {}

        def claim(owner: str, run_id: str = run_id, barrier: threading.Barrier = barrier) -> Any:
            barrier.wait()
            return store.turns.claim(run_id, owner, 30, 10)

        threads = [in_thread(lambda owner=owner: claim(owner), owner) for owner in ("A", "B")]
        for (thread, box), owner in zip(threads, ("A", "B"), strict=True):
            thread.join(10)
            assert "error" not in box, box
            results[owner] = box["value"]
        winners = [owner for owner, claimed in results.items() if claimed is not None]
        assert len(winners) == 1, (run_id, results)
        run = WorkflowRun.objects.get(pk=run_id)
        assert run.owner_id == winners[0] and run.owner_epoch == 1
        wins.append(winners[0])
    assert len(wins) == 200


def test_renewal_extends_the_lease_and_detects_a_takeover() -> None:
    store = DjangoStore()
    handle = client.start("tests.echo")
    claimed = store.turns.claim(handle.run_id, "A", 30, 10)
    assert claimed is not None and claimed.epoch == 1
    before = WorkflowRun.objects.get(pk=handle.run_id).lease_expires_at
    time.sleep(0.05)
    assert store.turns.renew("A", {handle.run_id: 1}, 30).lost == set()
    assert WorkflowRun.objects.get(pk=handle.run_id).lease_expires_at > before
    # Expire A's lease and let B take over: A's next renewal finds the new epoch.
    WorkflowRun.objects.filter(pk=handle.run_id).update(lease_expires_at="2000-01-01T00:00:00Z")
    assert store.turns.claim(handle.run_id, "B", 30, 10) is not None
    assert store.turns.renew("A", {handle.run_id: 1}, 30).lost == {handle.run_id}
    assert WorkflowRun.objects.get(pk=handle.run_id).owner_epoch == 2


@pytest.mark.postgres
def test_a_run_whose_row_is_locked_elsewhere_is_skipped_by_the_renewal_not_lost() -> None:
    """The renewal does not wait for a row another transaction holds (it would stall the
    heartbeat of every run): that run's lease is left as it was, and said so."""
    import psycopg

    store = DjangoStore()
    handle = client.start("tests.echo")
    assert store.turns.claim(handle.run_id, "A", 30, 10) is not None
    before = WorkflowRun.objects.get(pk=handle.run_id).lease_expires_at
    params = dict(connection.get_connection_params())
    params.pop("cursor_factory", None)
    with psycopg.connect(**params) as elsewhere:
        elsewhere.execute("SELECT 1 FROM django_weft_workflowrun WHERE id = %s FOR UPDATE", [handle.run_id])
        renewal = store.turns.renew("A", {handle.run_id: 1}, 60)
        elsewhere.rollback()
    assert (renewal.lost, renewal.skipped) == (set(), {handle.run_id})
    assert WorkflowRun.objects.get(pk=handle.run_id).lease_expires_at == before
    renewal = store.turns.renew("A", {handle.run_id: 1}, 60)
    assert (renewal.lost, renewal.skipped) == (set(), frozenset())
    assert WorkflowRun.objects.get(pk=handle.run_id).lease_expires_at > before


def test_renewal_does_not_call_a_run_its_owner_has_just_ended_lost() -> None:
    store = DjangoStore()
    handle = client.start("tests.echo")
    assert store.turns.claim(handle.run_id, "A", 30, 10) is not None
    store.turns.complete(handle.run_id, "A", 1, "null")
    # The heartbeat's snapshot still holds it (the turn has not forgotten it yet).
    assert store.turns.renew("A", {handle.run_id: 1}, 30).lost == set()


def test_engine_renew_leases_deposes_the_lost_run_locally() -> None:
    handle = client.start("tests.fence_probe", args=["rn"])
    engine_a = make_engine("A")
    engine_b = make_engine("B")
    reached = threading.Event()
    proceed = threading.Event()

    def pause(context: dict[str, Any]) -> None:
        if context["engine"] is engine_a and context["seq"] == 0:
            reached.set()
            proceed.wait(10)

    faults.arm("after_step_commit", pause)
    thread, box = in_thread(lambda: engine_a.run_turn(handle.run_id), "thread-A")
    assert reached.wait(10)
    WorkflowRun.objects.filter(pk=handle.run_id).update(lease_expires_at="2000-01-01T00:00:00Z")
    assert engine_b.store.claim(handle.run_id, "B", 30, 10) is not None
    assert engine_a.renew_leases() == {handle.run_id}
    proceed.set()
    thread.join(10)
    # A stopped at its next durable operation without running step 1.
    assert box["value"] == TurnOutcome.DEPOSED
    assert SideEffect.objects.filter(key="rn:1").count() == 0
    assert Step.objects.filter(run_id=handle.run_id).count() == 1


def test_fenced_writes_are_rejected_after_the_epoch_moves() -> None:
    from django_weft.engine.errors import Deposed
    from django_weft.engine.records import StepWrite

    store = DjangoStore()
    handle = client.start("tests.echo")
    claimed = store.turns.claim(handle.run_id, "A", 30, 10)
    assert claimed is not None
    WorkflowRun.objects.filter(pk=handle.run_id).update(owner_epoch=5)  # someone rotated it
    now = store.db_now()
    write = StepWrite(0, "activity", "x", "completed", None, "1", None, 1, now, now)
    with pytest.raises(Deposed):
        store.turns.commit_step(handle.run_id, "A", 1, write)
    with pytest.raises(Deposed):
        store.turns.complete(handle.run_id, "A", 1, "1")
    with pytest.raises(Deposed):
        store.turns.park(handle.run_id, "A", 1, {"kind": "sleep"}, [write], [])
    with pytest.raises(Deposed):
        store.turns.commit_step_atomic(handle.run_id, "A", 1, lambda: write)
    assert Step.objects.count() == 0
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "running"


def test_a_deposed_engine_stops_even_if_workflow_code_catches_everything() -> None:
    handle = client.start("tests.saga", args=["sg"])
    engine_a = make_engine("A")
    store = DjangoStore()

    def take_over(context: dict[str, Any]) -> None:
        # Just before A records the charge, another engine takes the run over.
        if context["engine"] is engine_a:
            WorkflowRun.objects.filter(pk=handle.run_id).update(lease_expires_at="2000-01-01T00:00:00Z")
            assert store.turns.claim(handle.run_id, "B", 30, 10) is not None

    faults.arm("before_step_commit", take_over)
    assert engine_a.run_turn(handle.run_id) == TurnOutcome.DEPOSED
    # The saga's `except Exception` compensation did not run on the deposed engine.
    assert SideEffect.objects.filter(key="sg:refund").count() == 0
    assert Step.objects.filter(run_id=handle.run_id).count() == 0


@pytest.mark.postgres
def test_the_step_commit_is_a_server_side_prepared_statement() -> None:
    handle = client.start("tests.inline_steps", args=[3])
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        statements = [row[0] for row in cursor.fetchall()]
    assert any("django_weft_step" in statement for statement in statements)


@pytest.mark.postgres
def test_a_takeover_that_waited_for_the_row_lock_sees_the_previous_owners_last_step() -> None:
    """The claim waits for the old owner's transaction; the history it loads must include
    what that transaction committed, or the new owner would run the step again."""
    from datetime import UTC, datetime

    from django_weft.engine.records import StepWrite

    handle = client.start("tests.echo")
    store = DjangoStore()
    old = store.turns.claim(handle.run_id, "engine-old", 0.01, 0)
    assert old is not None
    inside, release = threading.Event(), threading.Event()

    def body() -> StepWrite:
        inside.set()
        assert release.wait(10)
        now = datetime.now(UTC)
        return StepWrite(0, "activity", "tests.noop", "completed", None, "1", None, 1, now, now)

    writer, _ = in_thread(
        lambda: store.turns.commit_step_atomic(handle.run_id, "engine-old", old.epoch, body), "old"
    )
    assert inside.wait(10)  # the old owner holds the run row...
    time.sleep(0.05)  # ...and its 10 ms lease has surely run out before the claim starts
    claimed: dict[str, Any] = {}
    taker, _ = in_thread(
        lambda: claimed.setdefault("run", DjangoStore().turns.claim(handle.run_id, "engine-new", 30, 0)),
        "new",
    )
    wait_until(claim_waits_for_a_lock, "the claim waits for the run row's lock")
    release.set()
    writer.join(10)
    taker.join(10)
    run = claimed["run"]
    assert run is not None and run.epoch == old.epoch + 1
    assert list(run.steps) == [0]


def claim_waits_for_a_lock() -> bool:
    """Whether another connection to the test database is blocked on a lock (PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
        )
        (waiting,) = cursor.fetchone()
    return bool(waiting)


def test_only_a_runs_first_claim_skips_reading_the_history() -> None:
    """A run nobody owned before has no steps, so its first claim spares the read; every
    later claim (here a takeover after the first owner recorded a step) reads it."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    from django_weft.engine.records import StepWrite

    handle = client.start("tests.echo")
    store = DjangoStore()

    def claim(owner: str) -> tuple[Any, list[str]]:
        with CaptureQueriesContext(connections[store.alias]) as captured:
            claimed = store.turns.claim(handle.run_id, owner, 0.01, 0)
        return claimed, [q["sql"] for q in captured.captured_queries]

    first, sql = claim("engine-first")
    assert first is not None and first.epoch == 1 and first.steps == {}
    assert not any("django_weft_step" in statement for statement in sql)
    now = first.db_now
    store.turns.commit_step(
        handle.run_id,
        "engine-first",
        first.epoch,
        StepWrite(0, "activity", "tests.noop", "completed", None, "1", None, 1, now, now),
    )
    time.sleep(0.05)  # the first owner's lease (10 ms) runs out
    second, sql = claim("engine-second")
    assert second is not None and second.epoch == 2
    assert list(second.steps) == [0]
    assert any("django_weft_step" in statement for statement in sql)
