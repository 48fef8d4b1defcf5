"""Work notices on PostgreSQL (docs/explanation/architecture.md): a start made where no
dispatcher delivers tells the listening workers with a ``NOTIFY`` that commits with the
run, in the run's own ``INSERT`` when the start is outside a transaction."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_weft import client
from django_weft.models import WorkflowRun
from tests.support.notices import notices

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def test_a_start_outside_a_transaction_is_one_statement_and_its_notice(
    listener: psycopg.Connection[Any],
) -> None:
    with CaptureQueriesContext(connection) as queries:
        handle = client.start("tests.obs.plain", args=[1], priority=7)
    assert len(queries) == 1, [query["sql"][:120] for query in queries]
    assert "pg_notify" in queries[0]["sql"]
    assert notices(listener) == [f"{handle.run_id} 7"]
    assert handle.status() == "running"  # runnable, for the worker the notice wakes


def test_a_start_in_a_transaction_notifies_at_its_commit_and_never_after_a_rollback(
    listener: psycopg.Connection[Any],
) -> None:
    with transaction.atomic():
        kept = client.start("tests.obs.plain", args=[1])
        assert notices(listener, timeout=0.3) == []  # not before the commit
    assert notices(listener) == [f"{kept.run_id} 0"]

    with pytest.raises(RuntimeError), transaction.atomic():
        client.start("tests.obs.plain", args=[1])
        raise RuntimeError("the caller's transaction rolls back")
    assert notices(listener, timeout=0.5) == []
    assert [str(pk) for pk in WorkflowRun.objects.values_list("pk", flat=True)] == [kept.run_id]
