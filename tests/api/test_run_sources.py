"""The jobs of ``POST runs/bulk/`` read their runs through the runtime's ``"runs_list"``
run source: the runs ``GET runs/`` lists for the same filter, found by the tick without
importing the API; the import strings stored before run sources had names are rewritten
by a migration."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import override_settings
from django.utils import timezone

from django_weft import client
from django_weft.engine.errors import InvalidInput
from django_weft.engine.records import RunStatus
from django_weft.models import BulkJob, WorkflowRun
from django_weft.runtime import tick
from django_weft.runtime.dispatch import SweepOnlyDispatcher
from django_weft.runtime.run_sources import RUNS_LIST, runs_listed
from tests.support.driver import park

from .conftest import Api
from .test_bulk import GOLD_ONLY, finished, listed, sleeping, status, waiting

pytestmark = pytest.mark.django_db(transaction=True)

BIG = str(2**63)


def selected(spec: dict[str, list[str]]) -> set[str]:
    return {str(pk) for pk in runs_listed(WorkflowRun.objects.all(), spec).values_list("pk", flat=True)}


def test_the_runtime_selects_the_runs_the_list_shows_for_the_same_filter(api: Api) -> None:
    parent = client.start("tests.c.parent", args=["family", 3600], id="family")
    park(parent.run_id)
    for i in range(2):
        sleeping(f"sleepy-{i}", customer=7, tier="gold", score=2.5)
    sleeping("sleepy-str", customer="7", tier="basic", vip="true")
    sleeping("sleepy-big", customer=BIG, vip=True)
    middle = datetime.now(UTC)
    time.sleep(0.01)
    waiting("waits-0", customer=8)
    finished("tests.echo", "echo-1", tier="gold", score=2)
    finished("tests.raises", "raises-1")
    naive = timezone.make_naive(middle).isoformat()

    filters: list[dict[str, list[str]]] = [
        {"status": ["running"]},
        {"status": ["waiting", "failed"]},
        {"status": [status.value for status in RunStatus]},
        {"workflow": ["tests.sleepy"]},
        {"workflow": ["  tests.sleepy "]},
        {"workflow": ["tests.echo", "tests.sleepy"]},  # a single-valued filter repeated: the last
        {"workflow": [""]},
        {"workflow_id": ["sleepy-1"]},
        {"parent": [parent.run_id]},
        {"parent": [parent.run_id.replace("-", "").upper()]},
        {"created_after": [middle.isoformat()]},
        {"created_after": [middle.isoformat().replace("+00:00", "Z")]},
        {"created_before": [naive], "workflow": ["tests.sleepy"]},
        {"search.customer": ["7"]},
        {"search.customer": ["7", "8"]},  # both: no run has two values
        {"search.customer": [BIG]},
        {"search.vip": ["true"]},
        {"search.score": ["2.5"]},
        {"search.score": ["2"]},
        {"search.tier": ["gold"], "status": ["running", "completed"]},
        {"search.nowhere": ["x"]},
    ]
    for spec in filters:
        assert set(listed(api, spec)) == selected(spec), spec
    assert selected({"search.customer": ["7"]}) and selected({"search.customer": [BIG]})

    refused: list[dict[str, list[str]]] = [
        {"status": ["bogus"]},
        {"parent": ["not-a-uuid"]},
        {"created_after": ["yesterday"]},
        {"created_after": ["01/02/2030 10:00"]},  # a locale's format, not ISO 8601
        {"search.a__b": ["x"]},
        {"search.x": ["a\x00b"]},
        {"stauts": ["running"]},
    ]
    for spec in refused:
        dry_run = api.post("runs/bulk/", {"action": "cancel", "filter": spec, "dry_run": True})
        assert dry_run.status_code == 400 and "filter" in dry_run.json()["error"]["details"]["fields"], spec
        with pytest.raises(InvalidInput) as caught:
            selected(spec)
        assert getattr(caught.value, "field", None) == "filter", spec


def test_the_tick_reads_the_runs_of_a_rest_job_without_importing_the_api(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    gold = [sleeping(f"gold-{i}", tier="gold", lot="x") for i in range(3)]
    basic = sleeping("basic", tier="basic", lot="x")
    with override_settings(WEFT_API_RUN_FILTER=GOLD_ONLY):
        response = api.post("runs/bulk/", {"action": "cancel", "filter": {"search.lot": "x"}})
        assert response.status_code == 202, response.text
        assert BulkJob.objects.get().runs_from == RUNS_LIST
        for name in [name for name in sys.modules if name.split(".")[:2] == ["django_weft", "api"]]:
            monkeypatch.setitem(sys.modules, name, None)  # importing it now raises ImportError
        for _ in range(20):
            tick(SweepOnlyDispatcher())
            if BulkJob.objects.get().status == "completed":
                break
    job = BulkJob.objects.get()
    assert (job.status, job.done, job.error) == ("completed", 3, "")
    assert all(status(run_id) == "cancelled" for run_id in gold) and status(basic) == "running"


BEFORE = [("django_weft", "0015_run_reset_links")]
AFTER = [("django_weft", "0016_bulk_job_run_source_names")]


def test_the_migration_names_the_sources_stored_as_import_strings() -> None:
    stored = {
        "django_weft.api.bulk.runs_of_job": "runs_list",
        "django_weft.runtime.bulk_jobs.runs_by_lookups": "lookups",
        "myproject.bulk.runs_of_tenant": "myproject.bulk.runs_of_tenant",  # the project registers it
    }
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        old = executor.loader.project_state(BEFORE).apps.get_model("django_weft", "BulkJob")
        for path in stored:
            old.objects.create(action="cancel", runs_from=path, as_of=timezone.now())

        MigrationExecutor(connection).migrate(AFTER)
        assert sorted(BulkJob.objects.values_list("runs_from", flat=True)) == sorted(stored.values())

        MigrationExecutor(connection).migrate(BEFORE)
        assert sorted(BulkJob.objects.values_list("runs_from", flat=True)) == sorted(stored)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes("django_weft"))
