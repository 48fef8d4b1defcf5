"""``any_of``: the sweep's "one of these keys" filter, one array parameter on PostgreSQL
(``= ANY``) and an ``IN`` list elsewhere, the same rows either way."""

from __future__ import annotations

import uuid

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_weft import client
from django_weft.models import Timer, WorkflowRun
from django_weft.store.statement_parts import any_of

pytestmark = pytest.mark.django_db


def test_it_selects_the_rows_of_the_keys_given_whatever_their_form(on_postgres: bool) -> None:
    runs = [client.start("tests.echo", args=[n]).run_id for n in range(3)]
    now = timezone.now()
    timers = [Timer.objects.create(run_id=run, seq=0, kind="sleep", fire_at=now).pk for run in runs]
    as_uuids = [uuid.UUID(run) for run in runs[:2]] + [uuid.uuid4()]  # one that matches nothing

    with CaptureQueriesContext(connection) as queries:
        by_uuid = set(WorkflowRun.objects.filter(any_of("pk", as_uuids)).values_list("pk", flat=True))
        by_text = set(WorkflowRun.objects.filter(any_of("pk", runs[1:])).values_list("pk", flat=True))
        by_fk = set(Timer.objects.filter(any_of("run_id", as_uuids)).values_list("pk", flat=True))
        by_int = Timer.objects.filter(any_of("pk", timers[:1])).update(fired_at=now)
        none = list(WorkflowRun.objects.filter(any_of("pk", [])))
    assert by_uuid == {uuid.UUID(run) for run in runs[:2]}
    assert by_text == {uuid.UUID(run) for run in runs[1:]}
    assert by_fk == set(timers[:2]) and by_int == 1 and none == []
    sql = [query["sql"] for query in queries.captured_queries]
    if on_postgres:
        assert all("= ANY(" in text and " IN (" not in text for text in sql), sql
    else:
        assert all(" IN (" in text for text in sql[:4]), sql


def test_values_are_converted_as_an_in_list_converts_them() -> None:
    run_id = client.start("tests.echo").run_id
    mixed = [uuid.UUID(run_id), str(uuid.uuid4()), None]  # a UUID, a string, and None
    assert list(WorkflowRun.objects.filter(any_of("pk", mixed)).values_list("pk", flat=True)) == [
        uuid.UUID(run_id)
    ]
    assert not WorkflowRun.objects.exclude(any_of("pk", [run_id, None])).exists()
    other = client.start("tests.echo").run_id
    assert list(WorkflowRun.objects.exclude(any_of("pk", [run_id, None])).values_list("pk", flat=True)) == [
        uuid.UUID(other)
    ]
    with pytest.raises(ValidationError):  # before any SQL: the transaction is not aborted
        list(WorkflowRun.objects.filter(any_of("pk", ["not a uuid"])))
    assert WorkflowRun.objects.count() == 2
