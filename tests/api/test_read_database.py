"""``WEFT_READ_DATABASE`` in the REST API: the routes that only show rows (the run and
schedule lists, a run, its history and its export, a schedule, the workflows' counts)
read the read database; a start, a signal, a lifecycle operation and a result's long
poll read and write the primary. The requests are made in this thread (Django's test
client), so the queries of each connection say which database a route read."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from django_weft import client
from django_weft.models import WorkflowRun
from tests.support.databases import BOTH, REPLICA, weft_queries
from tests.support.driver import park

pytestmark = pytest.mark.django_db(transaction=True, databases=BOTH)

API = "/api/weft/"


@pytest.fixture
def ops() -> Client:
    user = get_user_model().objects.create_superuser("ops", password="not used")
    browser = Client()
    browser.force_login(user)
    return browser


@pytest.fixture
def waiting_run() -> str:
    handle = client.start("tests.m.sleep_with_handlers", args=[3600], id="api-replica-1")
    park(handle.run_id)
    handle.signal("note", "a")
    return handle.run_id


def post(browser: Client, path: str, body: Any) -> Any:
    return browser.post(API + path, body, content_type="application/json")


READ_ONLY_ROUTES = (
    "runs/",
    "runs/?status=waiting&search.customer=7",
    "runs/{run}/",
    "runs/api-replica-1/",
    "runs/{run}/history/",
    "runs/{run}/export/",
    "schedules/",
    "schedules/nightly/",
    "workflows/",
)


def test_the_routes_that_only_show_rows_read_the_read_database(ops: Client, waiting_run: str) -> None:
    client.create_schedule("nightly", "tests.echo", cron="@daily")
    with override_settings(WEFT_READ_DATABASE=REPLICA), weft_queries() as queries:
        answers = {route: ops.get(API + route.format(run=waiting_run)) for route in READ_ONLY_ROUTES}
    assert {route: answer.status_code for route, answer in answers.items()} == dict.fromkeys(
        READ_ONLY_ROUTES, 200
    )
    assert answers["runs/{run}/"].json()["run_id"] == waiting_run
    assert [entry["name"] for entry in answers["runs/{run}/history/"].json()["results"]][-1] == "sleep"
    assert queries[REPLICA] and queries["default"] == []


def test_a_start_a_signal_a_cancel_and_a_result_use_the_primary_only(ops: Client) -> None:
    with override_settings(WEFT_READ_DATABASE=REPLICA), weft_queries() as queries:
        started = post(
            ops, "runs/", {"workflow": "tests.m.sleep_with_handlers", "args": [3600], "id": "api-w"}
        )
        run_id = started.json()["run_id"]
        signalled = post(ops, f"runs/{run_id}/signal/", {"name": "note", "payload": "a"})
        waited = ops.get(API + f"runs/{run_id}/result/?wait=0")
        cancelled = post(ops, f"runs/{run_id}/cancel/", {"reason": "done"})
    assert (started.status_code, signalled.status_code, waited.status_code) == (201, 202, 202)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert WorkflowRun.objects.get(pk=run_id).status == "cancelled"
    assert queries["default"] and queries[REPLICA] == []


def test_without_the_setting_no_route_reads_another_database(ops: Client, waiting_run: str) -> None:
    client.create_schedule("nightly", "tests.echo", cron="@daily")
    with weft_queries() as queries:
        for route in READ_ONLY_ROUTES:
            assert ops.get(API + route.format(run=waiting_run)).status_code == 200, route
    assert queries["default"] and queries[REPLICA] == []
