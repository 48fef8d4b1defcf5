"""The clock seam on PostgreSQL: without a virtual clock a turn's statements read the
database's ``now()`` as they always did; with one, they bind its time instead."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_weft import client
from django_weft.models import WorkflowRun
from django_weft.testing import WeftTestEnvironment, make_engine

from . import workflows as wf

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

VIRTUAL = datetime(2033, 3, 3, 3, 3, 3, tzinfo=UTC)


def _turn_statements() -> list[str]:
    run = client.start(wf.now)
    with CaptureQueriesContext(connection) as captured:
        make_engine().run_turn(run.run_id)
    assert run.status() == "completed"
    return [query["sql"] for query in captured.captured_queries]


def _claim_and_finish(statements: list[str]) -> tuple[str, str]:
    claims = (sql for sql in statements if sql.startswith(("UPDATE", "WITH old AS")))
    claim = next(sql for sql in claims if "owner_epoch + 1" in sql)
    finish = next(sql for sql in statements if sql.startswith("WITH done AS"))
    return claim, finish


def test_without_a_virtual_clock_the_claim_and_the_terminal_commit_read_now() -> None:
    statements = _turn_statements()
    claim, finish = _claim_and_finish(statements)
    assert "lease_expires_at = now() +" in claim and "claimed_at = now()" in claim
    assert "finished_at = now(), updated_at = now()" in finish
    # No time was read into Python first: the turn asks the database nothing else.
    assert not any("SELECT now()" in sql or "clock_timestamp" in sql for sql in statements)


def test_with_a_virtual_clock_they_bind_its_time() -> None:
    baseline = len(_turn_statements())
    with WeftTestEnvironment(start=VIRTUAL):
        statements = _turn_statements()
    claim, finish = _claim_and_finish(statements)
    assert "now()" not in claim and "now()" not in finish
    assert "2033-03-03" in claim and "2033-03-03" in finish
    assert len(statements) == baseline


def test_a_signal_wakes_its_run_at_the_virtual_clocks_time() -> None:
    with WeftTestEnvironment(start=VIRTUAL):
        handle = client.start("tests.m.collect", args=["go", 1])
        make_engine().run_turn(handle.run_id)
        client.get_handle(handle.run_id).signal("go", 1)
        run = WorkflowRun.objects.get(pk=handle.run_id)
        assert run.status == "running"
        assert run.ready_at == run.updated_at == VIRTUAL
