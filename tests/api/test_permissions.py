"""WEFT_API_RUN_FILTER hides runs as 404, over real HTTP. Who may call which route is
the generated matrix of test_permission_matrix.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db.models import QuerySet
from django.test import override_settings

from django_weft import client
from django_weft.models import Signal, WorkflowRun

from .conftest import Api

pytestmark = pytest.mark.django_db(transaction=True)


def only_gold(request: Any, queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
    """A tenant filter: the user sees only runs whose search attribute tier is gold."""
    return queryset.filter(search_attributes__tier="gold")


def test_the_run_filter_hides_runs_as_not_found(api: Api) -> None:
    gold = client.start("tests.sleepy", kwargs={"seconds": 60}, search_attributes={"tier": "gold"})
    basic = client.start(
        "tests.sleepy", kwargs={"seconds": 60}, id="basic-1", search_attributes={"tier": "b"}
    )
    with override_settings(WEFT_API_RUN_FILTER="tests.api.test_permissions.only_gold"):
        listed = [run["run_id"] for run in api.get("runs/").json()["results"]]
        assert listed == [gold.run_id]
        for ref in (basic.run_id, "basic-1"):
            for call in _every_route(api, ref):
                response = call()
                assert response.status_code == 404, response.text
                assert response.json()["error"]["code"] == "not_found"
        assert api.get(f"runs/{gold.run_id}/").status_code == 200
    assert Signal.objects.count() == 0
    assert WorkflowRun.objects.get(pk=basic.run_id).status in ("running", "waiting")


def _every_route(api: Api, ref: str) -> list[Callable[[], Any]]:
    return [
        lambda: api.get(f"runs/{ref}/"),
        lambda: api.get(f"runs/{ref}/history/"),
        lambda: api.get(f"runs/{ref}/result/"),
        lambda: api.get(f"runs/{ref}/updates/some-update/"),
        lambda: api.post(f"runs/{ref}/signal/", {"name": "poke"}),
        lambda: api.post(f"runs/{ref}/update/", {"name": "x", "wait": 0}),
        lambda: api.post(f"runs/{ref}/query/", {"name": "x"}),
        lambda: api.post(f"runs/{ref}/cancel/"),
        lambda: api.post(f"runs/{ref}/suspend/"),
        lambda: api.post(f"runs/{ref}/resume/"),
        lambda: api.post(f"runs/{ref}/retry/"),
        lambda: api.post(f"runs/{ref}/reset/", {"to_seq": 0, "reason": "hidden"}),
    ]


def test_the_run_filter_does_not_leak_a_taken_id(api: Api) -> None:
    hidden = client.start("tests.sleepy", id="shared-id", search_attributes={"tier": "basic"})
    with override_settings(WEFT_API_RUN_FILTER="tests.api.test_permissions.only_gold"):
        response = api.post("runs/", {"workflow": "tests.sleepy", "id": "shared-id", "on_conflict": "fail"})
        assert response.status_code == 409 and response.json()["error"]["code"] == "already_exists"
        assert hidden.run_id not in response.text
        found = api.post("runs/", {"workflow": "tests.sleepy", "id": "shared-id"})
        assert found.status_code == 409 and hidden.run_id not in found.text


def test_a_start_outside_the_run_filter_is_refused_and_rolled_back(api: Api) -> None:
    with override_settings(WEFT_API_RUN_FILTER="tests.api.test_permissions.only_gold"):
        refused = api.post("runs/", {"workflow": "tests.sleepy", "search_attributes": {"tier": "basic"}})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied"
        assert not WorkflowRun.objects.exists()
        allowed = api.post("runs/", {"workflow": "tests.sleepy", "search_attributes": {"tier": "gold"}})
        assert allowed.status_code == 201
    assert WorkflowRun.objects.count() == 1
