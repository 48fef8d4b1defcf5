"""``runtime.apply_bulk``: a lifecycle operation on many runs, each in its own transaction,
with an outcome per run (changed, skipped with the reason, failed)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_weft import WorkflowCancelled, client
from django_weft.engine.errors import InvalidInput
from django_weft.engine.executor import TurnOutcome
from django_weft.models import WorkflowRun
from django_weft.runtime import BulkRun, apply_bulk, count_runs, refusal_for
from django_weft.testing import drive, make_engine
from tests.support.driver import park

pytestmark = pytest.mark.django_db(transaction=True)

WAITS = "tests.m.wait_with_timeout"


def waiting(workflow_id: str) -> str:
    handle = client.start(WAITS, args=[3600], id=workflow_id)
    park(handle.run_id)
    return handle.run_id


def finished(workflow: str, workflow_id: str, *args: Any) -> str:
    handle = client.start(workflow, args=list(args), id=workflow_id)
    drive(handle.run_id)
    return handle.run_id


def status(run_id: str) -> str:
    return WorkflowRun.objects.get(pk=run_id).status


def test_cancel_by_ids_changes_the_active_runs_and_skips_the_finished_ones() -> None:
    first, second = waiting("bulk-1"), waiting("bulk-2")
    done = finished("tests.echo", "bulk-done")

    outcome = apply_bulk("cancel", [first, done, uuid.UUID(second)], reason="cleaning up")

    assert outcome.operation == "cancel"
    assert outcome.changed_ids == [first, second]
    assert [run.label for run in outcome.changed] == ["bulk-1", "bulk-2"]
    assert outcome.skipped == {"already finished (completed)": (BulkRun(done, "bulk-done"),)}
    assert outcome.failed == ()
    assert (len(outcome.changed), outcome.skipped_count, outcome.total) == (2, 1, 3)
    for run_id in (first, second):
        run = WorkflowRun.objects.get(pk=run_id)
        assert run.status == "cancelled" and run.error["reason"] == "cleaning up"
        with pytest.raises(WorkflowCancelled):
            client.get_handle(run_id).result(timeout=0)
    assert status(done) == "completed"


def test_a_queryset_is_read_in_keyset_batches_and_no_run_leaving_its_filter_is_missed() -> None:
    ids = {waiting(f"keyset-{i}") for i in range(10)}
    other = waiting("not-this-one")
    runs = WorkflowRun.objects.filter(status="waiting").exclude(workflow_id="not-this-one")

    with CaptureQueriesContext(connection) as queries:
        outcome = apply_bulk("cancel", runs, batch_size=3)

    # Each cancelled run leaves "status = waiting": an OFFSET would skip every other batch.
    assert set(outcome.changed_ids) == ids and outcome.skipped == {} and outcome.failed == ()
    assert WorkflowRun.objects.filter(pk__in=ids, status="cancelled").count() == 10
    assert status(other) == "waiting"
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("SELECT")]
    batch_reads = [sql for sql in reads if "ORDER BY" in sql and "LIMIT 3" in sql]
    assert len(batch_reads) == 5  # 3 + 3 + 3 + 1, then an empty one
    assert not any("OFFSET" in sql for sql in batch_reads)


def test_suspend_resume_and_retry_skip_the_runs_their_status_does_not_allow() -> None:
    parked = waiting("srr-waiting")
    failed = finished("tests.raises", "srr-failed")
    done = finished("tests.echo", "srr-done")

    assert apply_bulk("suspend", [parked]).changed_ids == [parked]
    assert status(parked) == "suspended"
    again = apply_bulk("suspend", [parked, done])
    assert again.changed == ()
    assert again.skipped == {
        "not running or waiting (suspended)": (BulkRun(parked, "srr-waiting"),),
        "already finished (completed)": (BulkRun(done, "srr-done"),),
    }

    assert apply_bulk("resume", [parked]).changed_ids == [parked]
    assert status(parked) == "running"
    resumed_again = apply_bulk("resume", [parked])
    assert resumed_again.skipped == {"not suspended (running)": (BulkRun(parked, "srr-waiting"),)}

    retried = apply_bulk("retry", [failed, parked, done])
    assert retried.changed_ids == [failed]
    assert status(failed) == "running" and WorkflowRun.objects.get(pk=failed).attempt == 2
    assert retried.skipped == {
        "not failed (running)": (BulkRun(parked, "srr-waiting"),),
        "not failed (completed)": (BulkRun(done, "srr-done"),),
    }


def test_retry_skips_a_failed_run_whose_workflow_id_another_run_now_holds() -> None:
    failed = finished("tests.raises", "order-7")
    client.start("tests.echo", id="order-7", on_conflict="start_new_if_terminal")

    outcome = apply_bulk("retry", [failed])

    assert outcome.skipped == {"another run with its workflow id is active": (BulkRun(failed, "order-7"),)}
    assert status(failed) == "failed"


def test_a_run_that_finishes_after_its_batch_was_read_is_skipped_with_the_status_its_lock_saw() -> None:
    parent = client.start("tests.c.parent", args=["bulk-family", 3600], id="bulk-parent")
    park(parent.run_id)
    child = WorkflowRun.objects.get(parent_id=parent.run_id)
    assert make_engine().run_turn(str(child.pk)) == TurnOutcome.PARKED

    # Both are read as waiting; cancelling the parent cancels its child (its parent-close
    # policy), so the child's own cancel finds it finished under the lock.
    outcome = apply_bulk("cancel", [parent.run_id, str(child.pk)])

    assert outcome.changed_ids == [parent.run_id]
    assert outcome.skipped == {"already finished (cancelled)": (BulkRun(str(child.pk), child.workflow_id),)}
    assert status(str(child.pk)) == "cancelled"


def test_a_continued_run_is_skipped_not_followed_to_the_run_it_continued_as() -> None:
    handle = client.start("tests.countdown", args=[1], id="bulk-countdown")
    make_engine().run_turn(handle.run_id)
    assert status(handle.run_id) == "continued"
    successor = WorkflowRun.objects.filter(workflow_id="bulk-countdown").exclude(pk=handle.run_id).get()

    outcome = apply_bulk("cancel", [handle.run_id])

    reason = "already finished (continued as new)"
    assert outcome.skipped == {reason: (BulkRun(handle.run_id, "bulk-countdown"),)}
    assert WorkflowRun.objects.get(pk=successor.pk).status != "cancelled"


def test_ids_outside_the_runs_or_outside_within_are_skipped_as_no_such_run() -> None:
    inside, outside = waiting("within-1"), waiting("within-2")
    unknown = str(uuid.uuid4())

    outcome = apply_bulk(
        "cancel", [unknown, inside, outside], within=WorkflowRun.objects.exclude(workflow_id="within-2")
    )

    assert outcome.changed_ids == [inside]
    assert outcome.skipped == {"no such run": (BulkRun(unknown), BulkRun(outside))}
    assert outcome.skipped["no such run"][0].label == unknown
    assert status(outside) == "waiting"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ids: apply_bulk("cancel", [*ids, "order-1"]), "not a run id: 'order-1'; nothing was changed"),
        (lambda ids: apply_bulk("cancel", [*ids, None]), "not a run id: None"),
        (lambda ids: apply_bulk("cancel", ids[0]), "as a list, not a single string"),
        (lambda ids: apply_bulk("explode", ids), "unknown bulk operation 'explode'; use one of cancel"),
        (lambda ids: apply_bulk("suspend", ids, reason="why"), "suspend takes no reason"),
        (lambda ids: apply_bulk("cancel", ids, reason=7), "reason must be a string; got int"),
        (lambda ids: apply_bulk("cancel", ids, batch_size=0), "batch_size must be a whole number"),
        (lambda ids: apply_bulk("cancel", WorkflowRun.objects.all()[:5]), "a sliced queryset"),
    ],
)
def test_bad_input_is_refused_before_anything_changes(call: Any, message: str) -> None:
    run_id = waiting("bad-input")
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(")):
        call([run_id])
    assert status(run_id) == "waiting"


@pytest.fixture
def refusing_trigger() -> Iterator[None]:
    """A database trigger that refuses to cancel the run with workflow id ``bulk-boom``:
    an error no lifecycle rule expects, from the real database."""
    table = WorkflowRun._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION weft_test_refuse() RETURNS trigger AS $$ BEGIN "
                "IF NEW.status = 'cancelled' AND NEW.workflow_id = 'bulk-boom' THEN "
                "RAISE EXCEPTION 'refused by a test trigger'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(
                f"CREATE TRIGGER weft_test_refuse BEFORE UPDATE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION weft_test_refuse()"
            )
        else:
            cursor.execute(
                f"CREATE TRIGGER weft_test_refuse BEFORE UPDATE ON {table} "
                "WHEN NEW.status = 'cancelled' AND NEW.workflow_id = 'bulk-boom' "
                "BEGIN SELECT RAISE(ABORT, 'refused by a test trigger'); END"
            )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"DROP TRIGGER weft_test_refuse ON {table}")
                cursor.execute("DROP FUNCTION weft_test_refuse()")
            else:
                cursor.execute("DROP TRIGGER weft_test_refuse")


def test_an_unexpected_error_is_logged_and_recorded_and_the_other_runs_change(
    refusing_trigger: None, caplog: pytest.LogCaptureFixture
) -> None:
    before, boom, after = waiting("bulk-a"), waiting("bulk-boom"), waiting("bulk-z")
    django_weft_logger = logging.getLogger("django_weft")
    django_weft_logger.addHandler(caplog.handler)
    try:
        outcome = apply_bulk("cancel", [before, boom, after])
    finally:
        django_weft_logger.removeHandler(caplog.handler)

    assert outcome.changed_ids == [before, after]
    assert [failure.run for failure in outcome.failed] == [BulkRun(boom, "bulk-boom")]
    assert "refused by a test trigger" in outcome.failed[0].error
    assert status(boom) == "waiting"  # its transaction rolled back whole
    assert any(f"bulk cancel: run {boom} (bulk-boom) failed" in r.getMessage() for r in caplog.records)


def test_count_runs_counts_the_filtered_runs() -> None:
    for i in range(3):
        waiting(f"count-{i}")
    finished("tests.echo", "count-done")
    assert count_runs(WorkflowRun.objects.filter(status="waiting")) == 3
    assert count_runs(WorkflowRun.objects.all()) == 4


@pytest.mark.parametrize(
    ("operation", "run_status", "refusal"),
    [
        ("cancel", "pending", None),
        ("cancel", "suspended", None),
        ("cancel", "completed", "already finished (completed)"),
        ("cancel", "timed_out", "already finished (timed out)"),
        ("cancel", "continued", "already finished (continued as new)"),
        ("suspend", "waiting", None),
        ("suspend", "pending", "not running or waiting (pending)"),
        ("suspend", "failed", "already finished (failed)"),
        ("resume", "suspended", None),
        ("resume", "waiting", "not suspended (waiting)"),
        ("retry", "failed", None),
        ("retry", "cancelled", "not failed (cancelled)"),
    ],
)
def test_refusal_for_says_why_an_operation_leaves_a_status_alone(
    operation: str, run_status: str, refusal: str | None
) -> None:
    assert refusal_for(operation, run_status) == refusal
