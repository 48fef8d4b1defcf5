"""Messages' round trips on PostgreSQL: a signal's delivery is one statement (the run's
lock, the signal, the wake-up and the workers' notice); the turn that consumes it reads
the pending messages in one query and records the consumption in one fenced statement;
an update's application and its answer are one fenced statement each."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_weft import client
from django_weft.engine.errors import Deposed, WorkflowNotFound, WorkflowTerminalError
from django_weft.engine.executor import TurnOutcome
from django_weft.engine.records import StepWrite
from django_weft.models import Signal, Step, Timer, Update, WorkflowRun
from django_weft.runtime.messages import accept_update
from django_weft.store import DjangoStore
from django_weft.testing import make_engine
from tests.support.notices import notices

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def parked_for_signal(signal: str = "go", count: int = 1, **options: Any) -> Any:
    handle = client.start("tests.m.collect", args=[signal, count], **options)
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    return client.get_handle(handle.run_id)


def test_a_signal_that_wakes_its_run_is_one_statement_with_the_workers_notice(
    listener: psycopg.Connection[Any],
) -> None:
    handle = parked_for_signal()
    notices(listener, timeout=0.2)  # the start's
    with CaptureQueriesContext(connection) as queries:
        accepted = handle.signal("go", {"n": 1})
    # A run id needs no look-up first: the delivery is the one statement.
    assert len(queries) == 1, [query["sql"][:120] for query in queries]
    assert "pg_notify" in queries[0]["sql"] and "FOR UPDATE" in queries[0]["sql"]
    assert notices(listener) == [f"{handle.run_id} 0"]
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.status == "running" and run.owner_id is None and run.waiting_on is None
    stored = Signal.objects.get(run_id=handle.run_id)
    assert (stored.pk, stored.payload, stored.received_at) == (
        accepted.sequence,
        {"n": 1},
        accepted.received_at,
    )
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    assert handle.result() == [{"n": 1}]


def test_a_signal_by_workflow_id_reaches_its_run_and_the_notice_says_its_priority(
    listener: psycopg.Connection[Any],
) -> None:
    """A workflow id shaped like a run id that is no run's id is still a workflow id."""
    workflow_id = str(uuid.uuid4())
    handle = parked_for_signal(id=workflow_id, priority=7)
    assert handle.run_id != workflow_id
    notices(listener, timeout=0.2)
    accepted = client.get_handle(workflow_id).signal("go", "by id")
    assert not accepted.duplicate and accepted.run_id == handle.run_id
    assert notices(listener) == [f"{handle.run_id} 7"]
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    assert handle.result() == ["by id"]
    with pytest.raises(WorkflowNotFound):
        client.get_handle(str(uuid.uuid4())).signal("go")


def test_a_signal_the_run_does_not_wait_for_is_stored_without_a_wake_or_a_notice(
    listener: psycopg.Connection[Any],
) -> None:
    handle = parked_for_signal()
    notices(listener, timeout=0.2)
    accepted = handle.signal("later")
    assert not accepted.duplicate
    assert notices(listener, timeout=0.3) == []
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "waiting"
    assert Signal.objects.get(pk=accepted.sequence).consumed_seq is None


def test_a_signal_in_a_transaction_wakes_and_notifies_at_its_commit_and_not_after_a_rollback(
    listener: psycopg.Connection[Any],
) -> None:
    handle = parked_for_signal()
    notices(listener, timeout=0.2)
    with pytest.raises(RuntimeError), transaction.atomic():
        handle.signal("go", "dropped")
        raise RuntimeError("the caller's transaction rolls back")
    assert notices(listener, timeout=0.3) == []
    assert not Signal.objects.exists()
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "waiting"

    with transaction.atomic():
        handle.signal("go", "kept")
        assert notices(listener, timeout=0.3) == []  # not before the commit
    assert notices(listener) == [f"{handle.run_id} 0"]
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "running"


def test_a_repeated_signal_id_to_a_finished_run_returns_its_first_acceptance() -> None:
    handle = client.start("tests.m.collect", args=["go", 1])
    first = handle.signal("go", "a", signal_id="s-1")
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    again = handle.signal("go", "a", signal_id="s-1")
    assert again.duplicate and again.sequence == first.sequence
    with pytest.raises(WorkflowTerminalError, match="completed"):
        handle.signal("go", "b", signal_id="s-2")
    assert Signal.objects.filter(run_id=handle.run_id).count() == 1


def test_the_turn_consuming_a_signal_reads_the_messages_once_and_records_in_one_statement() -> None:
    handle = parked_for_signal()
    handle.signal("go", 5)
    with CaptureQueriesContext(connection) as queries:
        assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    statements = [query["sql"] for query in queries]
    # The claim, the history, the pending signals and updates (one UNION), the wait's
    # step with the signal's consumption, and the completion.
    assert len(statements) == 5, [sql[:100] for sql in statements]
    assert "UNION ALL" in statements[2]
    assert "consumed_seq" in statements[3] and "DELETE FROM" in statements[3]
    assert not any(sql in ("BEGIN", "COMMIT") for sql in statements)
    assert handle.result() == [5]
    assert Signal.objects.get(run_id=handle.run_id).consumed_seq == 0


def test_a_deposed_consumption_writes_nothing() -> None:
    """The wait's timeout timer, the signal and the step stay as they were when the fence
    refuses the write."""
    handle = client.start("tests.m.wait_with_timeout", args=[300])
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    accepted = client.get_handle(handle.run_id).signal("go", "x")
    store = DjangoStore()
    owned = store.turns.claim(handle.run_id, "engine-x", 30, 0)
    assert owned is not None
    WorkflowRun.objects.filter(pk=handle.run_id).update(owner_epoch=owned.epoch + 1)  # taken over
    now = owned.db_now
    result = json.dumps({"signal": accepted.sequence, "payload": "x"})
    step = StepWrite(0, "signal", "go", "completed", None, result, None, 1, now, now)
    steps_before = list(Step.objects.filter(run_id=handle.run_id).values_list("seq", "status"))
    with pytest.raises(Deposed):
        store.turns.finish_wait(handle.run_id, "engine-x", owned.epoch, step, signal_pk=accepted.sequence)
    assert Signal.objects.get(pk=accepted.sequence).consumed_seq is None
    assert Timer.objects.filter(run_id=handle.run_id, seq=0, fired_at__isnull=True).exists()
    assert list(Step.objects.filter(run_id=handle.run_id).values_list("seq", "status")) == steps_before


def test_a_signal_consumed_twice_is_refused_and_writes_nothing() -> None:
    handle = client.start("tests.m.wait_with_timeout", args=[300])
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    accepted = client.get_handle(handle.run_id).signal("go", "x")
    Signal.objects.filter(pk=accepted.sequence).update(consumed_seq=7)  # consumed elsewhere
    store = DjangoStore()
    owned = store.turns.claim(handle.run_id, "engine-x", 30, 0)
    assert owned is not None
    now = owned.db_now
    result = json.dumps({"signal": accepted.sequence, "payload": "x"})
    step = StepWrite(0, "signal", "go", "completed", None, result, None, 1, now, now)
    with pytest.raises(AssertionError, match="consumed twice"):
        store.turns.finish_wait(handle.run_id, "engine-x", owned.epoch, step, signal_pk=accepted.sequence)
    assert Timer.objects.filter(run_id=handle.run_id, seq=0, fired_at__isnull=True).exists()
    assert Step.objects.get(run_id=handle.run_id, seq=0).status != "completed"


def test_an_update_is_applied_and_answered_in_one_statement_each() -> None:
    handle = client.start("tests.m.cart", args=["u"])
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    update_pk, _ = accept_update(handle.run_id, "close", None)
    with CaptureQueriesContext(connection) as queries:
        assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    statements = [query["sql"] for query in queries]
    # The handler's step with the update marked applied, then its answer: one fenced
    # statement each (the completion also answers updates left pending; none here).
    fenced = [sql for sql in statements if sql.startswith("WITH fence AS")]
    writes = [sql for sql in fenced if "django_weft_update SET" in sql]
    assert len(writes) == 2, [sql[:100] for sql in statements]
    assert not any(sql in ("BEGIN", "COMMIT") for sql in statements)
    row = Update.objects.get(pk=update_pk)
    assert (row.status, row.result, row.error, row.applied_seq) == ("completed", "closed", None, 1)


def test_a_deposed_update_answer_writes_nothing() -> None:
    handle = client.start("tests.m.cart", args=["d"])
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    update_pk, _ = accept_update(handle.run_id, "close", None)
    store = DjangoStore()
    owned = store.turns.claim(handle.run_id, "engine-x", 30, 0)
    assert owned is not None
    WorkflowRun.objects.filter(pk=handle.run_id).update(owner_epoch=owned.epoch + 1)  # taken over
    now = owned.db_now
    step = StepWrite(0, "handler", "update:close", "completed", None, '"closed"', None, 1, now, now)
    with pytest.raises(Deposed):
        store.turns.apply_update(handle.run_id, "engine-x", owned.epoch, step, update_pk)
    with pytest.raises(Deposed):
        store.turns.answer_update(handle.run_id, "engine-x", owned.epoch, step, update_pk,
                                  ok=True, result_json='"closed"', error_json=None)  # fmt: skip
    row = Update.objects.get(pk=update_pk)
    assert (row.status, row.result, row.applied_seq) == ("accepted", None, None)
    assert not Step.objects.filter(run_id=handle.run_id, kind="handler").exists()
