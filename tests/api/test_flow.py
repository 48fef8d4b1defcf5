"""The main flow over real HTTP: start → signal → update → query → result, and the
lifecycle routes."""

from __future__ import annotations

import time
from typing import Any

import pytest

from django_weft import client
from django_weft.models import Signal, WorkflowRun

from ..integration.conftest import wait_for
from .conftest import Api

pytestmark = pytest.mark.django_db(transaction=True)


def _status(api: Api, ref: str) -> str:
    return str(api.get(f"runs/{ref}/").json()["status"])


def test_start_signal_update_query_result(api: Api, driver: Any) -> None:
    started = api.post("runs/", {"workflow": "tests.m.cart", "args": ["c1"], "id": "cart-c1"})
    assert started.status_code == 201, started.text
    run = started.json()
    assert started.headers["Location"] == run["url"]
    assert run["workflow_id"] == "cart-c1" and run["workflow"] == "tests.m.cart"
    assert set(run) >= {"run_id", "status", "args", "kwargs", "waiting_on", "owner_epoch", "url"}

    again = api.post("runs/", {"workflow": "tests.m.cart", "args": ["c1"], "id": "cart-c1"})
    assert again.status_code == 200 and again.json()["run_id"] == run["run_id"]
    assert "Location" not in again.headers

    wait_for(lambda: _status(api, "cart-c1") == "waiting", 20, "the run to park")
    signalled = api.post(
        "runs/cart-c1/signal/", {"name": "add", "payload": {"sku": "A1"}, "signal_id": "s-1"}
    )
    assert signalled.status_code == 202, signalled.text
    assert signalled.json()["duplicate"] is False and signalled.json()["signal_id"] == "s-1"

    updated = api.post("runs/cart-c1/update/", {"name": "address", "payload": {"city": "Oslo"}, "wait": 20})
    assert updated.status_code == 200, updated.text
    body = updated.json()
    assert body["status"] == "completed"
    assert body["result"] == {"address": {"city": "Oslo"}, "items": 1}
    outcome = api.get(f"runs/cart-c1/updates/{body['update_id']}/")
    assert outcome.status_code == 200 and outcome.json() == body

    queried = api.post("runs/cart-c1/query/", {"name": "count", "args": [10]})
    assert queried.status_code == 200 and queried.json() == {"result": 11}

    pending = api.get("runs/cart-c1/result/?wait=0")
    assert pending.status_code == 202 and pending.json()["status"] in {"running", "waiting"}

    closed = api.post("runs/cart-c1/update/", {"name": "close", "wait": 20})
    assert closed.status_code == 200, closed.text
    result = api.get("runs/cart-c1/result/?wait=20")
    assert result.status_code == 200, result.text
    assert result.json()["status"] == "completed"
    assert result.json()["result"]["address"] == {"city": "Oslo"}
    assert result.json()["result"]["items"] == [{"sku": "A1"}]

    history = api.get("runs/cart-c1/history/").json()
    kinds = [entry["kind"] for entry in history["results"]]
    assert "handler" in kinds and history["next"] is None
    assert [entry["seq"] for entry in history["results"]] == sorted(
        entry["seq"] for entry in history["results"]
    )
    later = api.get(f"runs/cart-c1/history/?after_seq={history['results'][0]['seq']}").json()
    assert later["results"] == history["results"][1:]


def test_lifecycle_routes_return_the_new_status_and_the_run(api: Api, driver: Any) -> None:
    run = api.post("runs/", {"workflow": "tests.sleepy", "kwargs": {"seconds": 30}}).json()
    ref = run["run_id"]
    wait_for(lambda: _status(api, ref) == "waiting", 20, "the run to sleep")

    suspended = api.post(f"runs/{ref}/suspend/")
    assert suspended.status_code == 200, suspended.text
    assert suspended.json()["status"] == "suspended" and suspended.json()["run"]["status"] == "suspended"
    again = api.post(f"runs/{ref}/suspend/")
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"

    resumed = api.post(f"runs/{ref}/resume/")
    assert resumed.status_code == 200 and resumed.json()["status"] == "running"

    cancelled = api.post(f"runs/{ref}/cancel/", {"reason": "customer changed their mind"})
    assert cancelled.status_code == 200 and cancelled.json()["run"]["status"] == "cancelled"
    outcome = api.get(f"runs/{ref}/result/")
    assert outcome.status_code == 409
    assert outcome.json()["error"]["code"] == "run_cancelled"
    assert outcome.json()["error"]["details"]["reason"] == "customer changed their mind"
    assert api.post(f"runs/{ref}/retry/").json()["error"]["code"] == "conflict"


def test_a_failed_run_reports_its_error_and_can_be_retried(api: Api, driver: Any) -> None:
    run = api.post("runs/", {"workflow": "tests.raises"}).json()
    wait_for(lambda: _status(api, run["run_id"]) == "failed", 20, "the run to fail")
    outcome = api.get(f"runs/{run['run_id']}/result/")
    assert outcome.status_code == 409
    error = outcome.json()["error"]
    assert error["code"] == "run_failed" and error["details"]["type"]
    retried = api.post(f"runs/{run['run_id']}/retry/")
    assert retried.status_code == 200 and retried.json()["status"] == "running"


def test_list_filters_and_cursor_pages(api: Api) -> None:
    for number in range(7):
        response = api.post(
            "runs/",
            {
                "workflow": "tests.echo" if number % 2 else "tests.sleepy",
                "id": f"list-{number}",
                "search_attributes": {"customer": number % 3, "tier": "gold" if number < 3 else "basic"},
            },
        )
        assert response.status_code == 201, response.text
        time.sleep(0.002)
    everything = api.get("runs/?page_size=3").json()
    assert [run["workflow_id"] for run in everything["results"]] == ["list-6", "list-5", "list-4"]
    assert everything["previous"] is None
    second = api.get(everything["next"]).json()
    assert [run["workflow_id"] for run in second["results"]] == ["list-3", "list-2", "list-1"]
    third = api.get(second["next"]).json()
    assert [run["workflow_id"] for run in third["results"]] == ["list-0"] and third["next"] is None

    def ids(query: str) -> list[str]:
        response = api.get(f"runs/?{query}")
        assert response.status_code == 200, response.text
        return sorted(run["workflow_id"] for run in response.json()["results"])

    assert ids("workflow=tests.echo") == ["list-1", "list-3", "list-5"]
    assert ids("workflow_id=list-4") == ["list-4"]
    assert ids("search.customer=1") == ["list-1", "list-4"]
    assert ids("search.tier=gold&search.customer=0") == ["list-0"]
    assert ids("status=running&status=completed&workflow=tests.sleepy") == [
        "list-0",
        "list-2",
        "list-4",
        "list-6",
    ]
    assert ids("status=failed") == []
    first = WorkflowRun.objects.get(workflow_id="list-0").created_at
    assert ids(f"created_before={(first.isoformat()).replace('+00:00', 'Z')}") == []


def test_idempotency_key_makes_a_retried_signal_and_start_count_once(api: Api) -> None:
    key = {"Idempotency-Key": "retry-me-1"}
    first = api.post("runs/", {"workflow": "tests.sleepy"}, headers=key)
    second = api.post("runs/", {"workflow": "tests.sleepy"}, headers=key)
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["run_id"] == second.json()["run_id"]
    assert first.json()["workflow_id"] == "retry-me-1"

    signal_key = {"Idempotency-Key": "sig-7"}
    one = api.post("runs/retry-me-1/signal/", {"name": "poke", "payload": 1}, headers=signal_key)
    two = api.post("runs/retry-me-1/signal/", {"name": "poke", "payload": 1}, headers=signal_key)
    assert one.status_code == two.status_code == 202
    assert (one.json()["duplicate"], two.json()["duplicate"]) == (False, True)
    assert Signal.objects.filter(run__workflow_id="retry-me-1").count() == 1


def test_workflows_lists_parameters_and_counts(api: Api) -> None:
    api.post("runs/", {"workflow": "tests.countdown", "args": [3]})
    workflows = {entry["name"]: entry for entry in api.get("workflows/").json()}
    countdown = workflows["tests.countdown"]
    assert countdown["parameters"] == [
        {"name": "n", "kind": "positional_or_keyword", "required": True, "annotation": "int"}
    ]
    assert countdown["counts"]["running"] == 1 and countdown["counts"]["completed"] == 0
    sleepy = workflows["tests.sleepy"]["parameters"][0]
    assert sleepy["default"] == 2.0 and sleepy["required"] is False
    assert workflows["tests.m.collect"]["description"].startswith("Consumes")


def test_a_list_page_costs_the_same_few_queries_whatever_its_length(
    django_assert_max_num_queries: Any,
) -> None:
    from django.test import Client

    from .conftest import WEFT_PERMISSIONS, make_user

    user = make_user("counter", staff=True, permissions=WEFT_PERMISSIONS)
    browser = Client()
    browser.force_login(user)
    for number in range(60):
        client.start("tests.echo", args=[number], search_attributes={"n": number})
    browser.get("/api/weft/runs/")  # warm the permission cache
    # session, user, permissions, the page: never one query per run.
    with django_assert_max_num_queries(5):
        page = browser.get("/api/weft/runs/?page_size=50").json()
    assert len(page["results"]) == 50 and page["next"]


def test_start_then_update_at_once_over_http(api: Api, driver: Any) -> None:
    """No wait between the start and the update: the run applies it when it gets there."""
    run = api.post("runs/", {"workflow": "tests.m.cart", "args": ["at-once"]}).json()
    updated = api.post(
        f"runs/{run['run_id']}/update/", {"name": "address", "payload": {"city": "Rome"}, "wait": 20}
    )
    assert updated.status_code == 200, updated.text
    assert updated.json()["result"] == {"address": {"city": "Rome"}, "items": 0}
    unknown = api.post(f"runs/{run['run_id']}/update/", {"name": "nope", "wait": 20})
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "unknown_handler"


def test_an_update_id_with_a_slash_is_polled_at_its_own_address(api: Api) -> None:
    run = api.post("runs/", {"workflow": "tests.m.cart", "args": ["slash"]}).json()
    sent = api.post(f"runs/{run['run_id']}/update/", {"name": "close", "update_id": "order/42", "wait": 0})
    assert sent.status_code == 202, sent.text
    polled = api.get(f"runs/{run['run_id']}/updates/order/42/")
    assert polled.status_code == 202 and polled.json()["update_id"] == "order/42", polled.text


def test_the_start_answer_is_the_run_as_stored(api: Api) -> None:
    """The start answers from what it inserted (no second read): it must equal a GET."""
    for body in ({"workflow": "tests.echo", "args": [1]}, {"workflow": "tests.echo", "id": "stored-1"}):
        started = api.post("runs/", body).json()
        assert api.get(started["url"]).json() == started
        again = api.post("runs/", {"workflow": "tests.echo", "id": started["workflow_id"]})
        assert again.status_code == 200 and again.json() == started


def test_the_starts_of_a_debounced_workflow_answer_with_the_run_that_will_start(api: Api) -> None:
    start = {"workflow": "tests.debounce.reindex", "args": ["products"]}
    first = api.post("runs/", {**start, "kwargs": {"n": 1}})
    assert first.status_code == 201, first.text
    again = api.post("runs/", {**start, "kwargs": {"n": 2}}, headers={"Idempotency-Key": "another-request"})
    assert again.status_code == 200, again.text
    run = again.json()
    assert (run["run_id"], run["workflow_id"]) == (first.json()["run_id"], first.json()["workflow_id"])
    assert (run["status"], run["kwargs"]) == ("pending", {"n": 2})
    assert run["waiting_on"]["kind"] == "debounce" and run["waiting_on"]["starts"] == 2
    assert run["waiting_on"]["text"].endswith("(2 starts collapsed)")
    delayed = api.post("runs/", {**start, "start_delay": "1m"})
    assert delayed.status_code == 400
    assert "is debounced" in delayed.json()["error"]["details"]["fields"]["start_delay"][0]
    unkeyed = api.post("runs/", {"workflow": "tests.debounce.bad_key", "args": ["raise"]})
    assert unkeyed.status_code == 400
    assert "debounce key" in unkeyed.json()["error"]["details"]["fields"]["args"][0]
    assert WorkflowRun.objects.filter(workflow_name__startswith="tests.debounce.").count() == 1
