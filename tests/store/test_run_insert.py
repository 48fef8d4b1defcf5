"""A start's one-statement ``INSERT`` on PostgreSQL (store/intake.py): written from the
model's fields and prepared, it must write every column as ``save()`` would, so a column
added to the run table later is written with its default and not left out."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext

from django_weft.models import WorkflowRun
from django_weft.runtime.process import get_store
from django_weft.testing import WeftTestEnvironment

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

VIRTUAL = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
TIMES = ("created_at", "updated_at", "ready_at", "dispatched_at")


def _fields() -> dict[str, Any]:
    return {
        "workflow_name": "tests.obs.plain",
        "workflow_version": "v2",
        "args": [1, {"nested": [None, "é"]}],
        "kwargs": {"key": "value"},
        "search_attributes": {"customer": 7},
        "priority": -3,
        "trace_context": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    }


def _row(run_id: uuid.UUID) -> dict[str, Any]:
    """The run's values as Django reads them, and which columns are SQL NULL (a JSON
    column holding JSON ``null`` reads as ``None`` too)."""
    run = WorkflowRun.objects.get(pk=run_id)
    fields = WorkflowRun._meta.concrete_fields
    row = {field.attname: getattr(run, field.attname) for field in fields}
    nulls = ", ".join(f'"{field.column}" IS NULL' for field in fields)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {nulls} FROM {WorkflowRun._meta.db_table} WHERE id = %s", [run_id])
        found = cursor.fetchone()
    assert found is not None
    row["null columns"] = {field.column for field, null in zip(fields, found, strict=True) if null}
    return row


def test_every_column_is_written_as_the_orm_writes_it() -> None:
    inserted_id, created_id = uuid.uuid4(), uuid.uuid4()
    get_store().intake.insert_runnable_run(inserted_id, _fields(), dispatched=False)
    WorkflowRun.objects.create(id=created_id, workflow_id=str(created_id), status="running", **_fields())
    inserted, created = _row(inserted_id), _row(created_id)
    for name in ("id", "workflow_id", *TIMES):
        inserted.pop(name), created.pop(name)
        inserted["null columns"].discard(name), created["null columns"].discard(name)
    assert inserted == created
    assert model_to_dict(WorkflowRun.objects.get(pk=inserted_id))["args"] == [1, {"nested": [None, "é"]}]


def test_its_times_are_the_statements_and_dispatched_only_when_asked() -> None:
    runs = {dispatched: uuid.uuid4() for dispatched in (False, True)}
    before = datetime.now(UTC)
    for dispatched, run_id in runs.items():
        run = get_store().intake.insert_runnable_run(run_id, _fields(), dispatched=dispatched)
        assert not run._state.adding and run._state.db == "default"
    quiet = WorkflowRun.objects.get(pk=runs[False])
    assert quiet.dispatched_at is None and quiet.ready_at is not None and quiet.ready_at >= before
    assert abs(quiet.created_at - quiet.updated_at).total_seconds() < 1  # save() stamps each in turn
    rung = WorkflowRun.objects.get(pk=runs[True])
    assert rung.dispatched_at == rung.ready_at


def test_a_virtual_clock_sets_its_times() -> None:
    run_id = uuid.uuid4()
    with WeftTestEnvironment(start=VIRTUAL):
        get_store().intake.insert_runnable_run(run_id, _fields(), dispatched=True)
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.ready_at == run.dispatched_at == VIRTUAL


def test_it_is_prepared_once_per_connection() -> None:
    """One statement per start, the same text every time (so the server plans it once)."""
    with CaptureQueriesContext(connection) as captured:
        for _ in range(3):
            get_store().intake.insert_runnable_run(uuid.uuid4(), _fields(), dispatched=False)
    assert len(captured) == 3
    raw = connection.connection
    assert raw is not None and raw.prepare_threshold is not None  # explicit preparation is on
    statements = {query["sql"].split(" VALUES ")[0] for query in captured.captured_queries}
    assert len(statements) == 1
    with raw.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%%INSERT INTO%%'")
        row = cursor.fetchone()
    assert row is not None and row[0] == 1


def test_a_failed_insert_in_the_callers_transaction_marks_it_for_rollback() -> None:
    """As a failed query of Django's own cursors does: the block cannot commit by mistake."""
    run_id = uuid.uuid4()
    get_store().intake.insert_runnable_run(run_id, _fields(), dispatched=False)
    with transaction.atomic():
        with pytest.raises(IntegrityError):
            get_store().intake.insert_runnable_run(run_id, _fields(), dispatched=False)
        assert connection.needs_rollback
    assert WorkflowRun.objects.filter(pk=run_id).count() == 1
