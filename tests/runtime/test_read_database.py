"""``WEFT_READ_DATABASE`` in the runtime: which alias each read goes to
(:func:`~django_weft.runtime.process.reading_alias`), that the client and the write paths
never read it, that ``DATABASE_ROUTERS`` do not move weft's reads either way, and the
checks of the setting (``django_weft.E030``, ``E031``)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import run_checks
from django.db import connections
from django.test import override_settings

from django_weft import client, runtime
from django_weft.models import WorkflowRun
from django_weft.runtime.process import reading_alias
from django_weft.testing import drive
from tests.support.databases import BOTH, REPLICA, weft_queries
from tests.support.driver import park

pytestmark = pytest.mark.django_db(transaction=True, databases=BOTH)


class ReadsFromTheReplica:
    """A project's replica router: every read to ``"replica"``, every write to ``"default"``."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return REPLICA

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "default"

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True


class ReadsFromTheDefault(ReadsFromTheReplica):
    def db_for_read(self, model: Any, **hints: Any) -> str:
        return "default"


def test_each_read_goes_where_the_setting_says() -> None:
    run = WorkflowRun.objects.using("default").create(workflow_id="where-1", workflow_name="tests.echo")
    assert reading_alias() == reading_alias(may_lag=True) == "default"
    with override_settings(WEFT_READ_DATABASE=REPLICA):
        assert reading_alias() == "default"
        assert reading_alias(may_lag=True) == REPLICA
        assert reading_alias(same_database_as=run) == "default"
        assert reading_alias(same_database_as=WorkflowRun.objects.using(REPLICA).get(pk=run.pk)) == REPLICA
        # A row made in memory was read from nowhere: what is read about it is the primary's.
        assert reading_alias(same_database_as=WorkflowRun(workflow_id="x")) == "default"
    with override_settings(WEFT_READ_DATABASE="default"):
        assert reading_alias(may_lag=True) == "default"


@override_settings(WEFT_READ_DATABASE=REPLICA)
def test_the_client_reads_its_own_writes_from_the_primary() -> None:
    with weft_queries() as queries:
        handle = client.start("tests.echo", args=["a"], id="own-writes")
        assert handle.describe()["status"] == "running"
        assert handle.history() == []
        drive(handle.run_id)
        assert handle.result(timeout=5) == {"args": ["a"], "kwargs": {}}
        assert handle.status() == "completed"
    assert queries["default"] and queries[REPLICA] == []


@override_settings(WEFT_READ_DATABASE=REPLICA)
def test_a_bulk_operation_reads_the_runs_it_changes_from_the_primary() -> None:
    handle = client.start("tests.m.sleep_with_handlers", args=[3600], id="bulk-primary")
    park(handle.run_id)
    lagging = runtime.run_queryset(may_lag=True).filter(pk=handle.run_id)
    with weft_queries() as queries:
        outcome = runtime.apply_bulk("cancel", lagging, reason="r")
        by_id = runtime.apply_bulk("resume", [handle.run_id], within=lagging)
    assert [run.run_id for run in outcome.changed] == [handle.run_id]
    assert by_id.skipped_count == 1  # read from the primary: cancelled already
    assert queries["default"] and queries[REPLICA] == []


def test_routers_do_not_move_wefts_reads() -> None:
    run_id = client.start("tests.echo", id="routed").run_id
    # A router sending every read to the replica: without the setting weft reads the primary.
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.ReadsFromTheReplica"]), weft_queries() as unset:
        run = runtime.get_run(run_id, may_lag=True)
        runtime.read_history(run)
        runtime.status_report(may_lag=True)
    assert unset["default"] and unset[REPLICA] == []
    # A router sending every read to the default database: with the setting, weft's
    # read-only reads go to the replica all the same.
    routed = override_settings(
        DATABASE_ROUTERS=[f"{__name__}.ReadsFromTheDefault"], WEFT_READ_DATABASE=REPLICA
    )
    with routed, weft_queries() as set_:
        run = runtime.get_run(run_id, may_lag=True)
        runtime.read_history(run)
        runtime.status_report(may_lag=True)
    assert set_[REPLICA] and set_["default"] == []


def check_errors(**settings: Any) -> dict[str, str]:
    with override_settings(**settings):
        return {
            str(message.id): str(message.msg)
            for message in run_checks()
            if message.id and "E03" in message.id
        }


def test_an_alias_not_in_databases_is_an_error_naming_the_setting() -> None:
    assert check_errors(WEFT_READ_DATABASE=REPLICA) == {}
    found = check_errors(WEFT_READ_DATABASE="replcia")
    assert found.keys() == {"django_weft.E030"}
    assert "WEFT_READ_DATABASE is 'replcia', which is not in DATABASES" in found["django_weft.E030"]
    assert "replica" in found["django_weft.E030"]  # the aliases there are listed
    assert "django_weft.E030" in check_errors(WEFT_READ_DATABASE=["replica"])


def test_a_read_database_of_another_kind_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections[REPLICA], "vendor", "mysql")
    found = check_errors(WEFT_READ_DATABASE=REPLICA)
    assert found.keys() == {"django_weft.E031"}
    assert "a mysql database" in found["django_weft.E031"]
