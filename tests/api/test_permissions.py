"""Who may call what, over real HTTP: every mutating route by (anonymous, non-staff, staff
without the permission, staff with it); and WEFT_API_RUN_FILTER hides runs as 404."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db.models import QuerySet
from django.test import override_settings

from django_weft import client
from django_weft.models import Signal, WorkflowRun

from .conftest import Api, make_user

pytestmark = pytest.mark.django_db(transaction=True)

# (route, body, the permission it needs, the status it answers when allowed)
MUTATING: list[tuple[str, dict[str, Any] | None, str, int]] = [
    ("runs/", {"workflow": "tests.sleepy", "id": "new-run"}, "add_workflowrun", 201),
    ("runs/{ref}/signal/", {"name": "poke"}, "signal_workflowrun", 202),
    ("runs/{ref}/update/", {"name": "nothing-here", "wait": 0}, "update_workflowrun", 202),
    ("runs/{ref}/suspend/", None, "suspend_workflowrun", 200),
    ("runs/{ref}/resume/", None, "suspend_workflowrun", 409),
    ("runs/{ref}/cancel/", {"reason": "matrix"}, "cancel_workflowrun", 200),
    ("runs/{ref}/retry/", None, "cancel_workflowrun", 409),
    ("runs/{ref}/query/", {"name": "nothing-here"}, "view_workflowrun", 400),
]
READS = ["runs/", "runs/{ref}/", "runs/{ref}/history/", "runs/{ref}/result/", "workflows/"]


@pytest.mark.parametrize(("route", "body", "permission", "allowed"), MUTATING, ids=[m[0] for m in MUTATING])
def test_each_mutating_route_needs_staff_and_its_permission(
    api: Api, route: str, body: dict[str, Any] | None, permission: str, allowed: int
) -> None:
    ref = client.start("tests.sleepy", kwargs={"seconds": 60}).run_id
    make_user("someone", staff=False, permissions=[permission])
    make_user("staff-without", staff=True, permissions=[p for p in _all() if p != permission])
    make_user("staff-with", staff=True, permissions=[permission, "view_workflowrun"])
    path = route.format(ref=ref)
    before = _snapshot()

    anonymous = api.as_user(None).post(path, body)
    assert anonymous.status_code == 401, anonymous.text
    assert anonymous.json()["error"]["code"] == "not_authenticated"
    for username in ("someone", "staff-without"):
        refused = api.as_user(username).post(path, body)
        assert refused.status_code == 403, (username, refused.text)
        assert refused.json()["error"]["code"] == "permission_denied"
    assert _snapshot() == before, "a refused request changed something"

    granted = api.as_user("staff-with").post(path, body)
    assert granted.status_code == allowed, granted.text


def test_reads_need_view_permission(api: Api) -> None:
    ref = client.start("tests.sleepy", kwargs={"seconds": 60}).run_id
    make_user("staff-no-view", staff=True, permissions=["add_workflowrun"])
    make_user("viewer", staff=True, permissions=["view_workflowrun"])
    for route in READS:
        path = route.format(ref=ref)
        assert api.as_user(None).get(path).status_code == 401
        assert api.as_user("staff-no-view").get(path).status_code == 403
        assert api.as_user("viewer").get(path).status_code in (200, 202), path


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


def _all() -> list[str]:
    from .conftest import WEFT_PERMISSIONS

    return WEFT_PERMISSIONS


def _snapshot() -> tuple[Any, ...]:
    return (
        sorted(WorkflowRun.objects.values_list("pk", "status", "owner_epoch")),
        Signal.objects.count(),
    )


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
