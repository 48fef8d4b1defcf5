"""``POST runs/{ref}/reset/``: a new run from a position of the history, both runs linked,
bad positions refused as 400 with nothing written, and two permissions needed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_weft import client
from django_weft.models import Signal, Step, Update, WorkflowRun
from django_weft.testing import drive
from tests.support.driver import park
from tests.testapp import workflows
from tests.testapp.models import SideEffect

from .conftest import Api, make_user


@pytest.fixture(autouse=True)
def _step_6_broken() -> Iterator[None]:
    workflows.reset_bugs["step_6"] = True
    yield
    workflows.reset_bugs["step_6"] = True


def _rows() -> tuple[int, ...]:
    return tuple(model.objects.count() for model in (WorkflowRun, Step, Signal, Update, SideEffect))


def _failed(api: Api, key: str) -> dict[str, Any]:
    started = api.post("runs/", {"workflow": "tests.r.ten_steps", "args": [key], "id": key})
    assert started.status_code == 201, started.text
    assert drive(started.json()["run_id"]) == "failed"
    return dict(started.json())


def test_reset_starts_the_new_run_and_both_show_their_link(api: Api) -> None:
    old = _failed(api, "rest-fix")
    workflows.reset_bugs["step_6"] = False

    response = api.post(f"runs/{old['run_id']}/reset/", {"to_seq": 5, "reason": "step 6 fixed"})

    assert response.status_code == 201, response.text
    body = response.json()
    new = body["run"]
    assert response.headers["Location"] == new["url"] and new["url"].endswith(f"/runs/{new['run_id']}/")
    assert body["status"] == new["status"] == "running"
    assert new["workflow_id"] == "rest-fix" and new["run_id"] != old["run_id"]
    assert new["reset_from"]["run_id"] == old["run_id"] and new["reset_from"]["seq"] == 5
    assert new["reset_from"]["reason"] == "step 6 fixed" and new["reset_to"] is None
    assert body["previous_run"]["run_id"] == old["run_id"]
    assert body["previous_run"]["status"] == "failed"
    assert body["previous_run"]["reset_to"]["run_id"] == new["run_id"]
    # The links show wherever a run is shown.
    assert api.get(f"runs/{old['run_id']}/").json()["reset_to"]["run_id"] == new["run_id"]
    assert api.get("runs/rest-fix/").json()["run_id"] == new["run_id"]
    listed = {run["run_id"]: run for run in api.get("runs/?workflow_id=rest-fix").json()["results"]}
    assert listed[new["run_id"]]["reset_from"]["run_id"] == old["run_id"]

    assert drive(new["run_id"]) == "completed"
    assert api.get("runs/rest-fix/result/").json() == {"status": "completed", "result": 45}
    executions = [SideEffect.objects.filter(key=f"rest-fix:{i}").count() for i in range(10)]
    assert executions == [1] * 5 + [2, 2] + [1] * 3
    history = api.get(f"runs/{new['run_id']}/history/").json()["results"]
    assert [entry["seq"] for entry in history] == list(range(10))


def test_a_bad_position_is_400_naming_to_seq_and_writes_nothing(api: Api) -> None:
    old = _failed(api, "rest-bad")
    path = f"runs/{old['run_id']}/reset/"
    before = _rows()
    cases = [
        ({"to_seq": -1, "reason": "x"}, "to_seq", "a position is 0 or more"),
        ({"to_seq": 99, "reason": "x"}, "to_seq", "past the end of the history"),
        ({"to_seq": 7, "reason": "x"}, "to_seq", "would fail at once"),
        ({"to_seq": 3, "reason": "x", "args": ["a", "b", "c"]}, None, "cannot be started with"),
        ({"to_seq": 3, "reason": ""}, "reason", "may not be blank"),
        ({"to_seq": "three", "reason": "x"}, "to_seq", "valid integer"),
        ({"reason": "x"}, "to_seq", "required"),
    ]
    for body, field, message in cases:
        response = api.post(path, body)
        assert response.status_code == 400, (body, response.text)
        error = response.json()["error"]
        assert error["code"] == "invalid", (body, error)
        assert message in str(error), (body, error)
        if field is not None:
            assert field in error["details"]["fields"], (body, error)
    assert _rows() == before


def test_a_run_that_is_not_the_latest_is_409(api: Api) -> None:
    old = _failed(api, "rest-latest")
    workflows.reset_bugs["step_6"] = False
    assert api.post(f"runs/{old['run_id']}/reset/", {"to_seq": 5, "reason": "first"}).status_code == 201
    before = _rows()
    again = api.post(f"runs/{old['run_id']}/reset/", {"to_seq": 5, "reason": "again"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    assert "not the latest run of its workflow id" in again.json()["error"]["message"]
    assert _rows() == before
    missing = api.post("runs/no-such-run/reset/", {"to_seq": 0, "reason": "x"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_reset_of_an_open_run_closes_it(api: Api) -> None:
    handle = client.start("tests.r.branch", args=["rest-open"], id="rest-open")
    park(handle.run_id)
    response = api.post("runs/rest-open/reset/", {"to_seq": 1, "reason": "again", "args": ["rest-open"]})
    assert response.status_code == 201, response.text
    previous = response.json()["previous_run"]
    assert previous["status"] == "cancelled" and previous["error"]["type"] == "django_weft.Reset"
    assert previous["owner_id"] is None


def test_reset_needs_both_the_cancel_and_the_start_permission(api: Api) -> None:
    handle = client.start("tests.r.branch", args=["rest-perm"], id="rest-perm")
    park(handle.run_id)
    path = f"runs/{handle.run_id}/reset/"
    body = {"to_seq": 1, "reason": "permissions"}
    make_user("cancels", staff=True, permissions=["view_workflowrun", "cancel_workflowrun"])
    make_user("starts", staff=True, permissions=["view_workflowrun", "add_workflowrun"])
    make_user("not-staff", staff=False, permissions=["cancel_workflowrun", "add_workflowrun"])
    make_user("both", staff=True, permissions=["cancel_workflowrun", "add_workflowrun"])
    before = (_rows(), WorkflowRun.objects.get(pk=handle.run_id).owner_epoch)
    assert api.as_user(None).post(path, body).status_code == 401
    for username in ("cancels", "starts", "not-staff"):
        refused = api.as_user(username).post(path, body)
        assert refused.status_code == 403, (username, refused.text)
        assert refused.json()["error"]["code"] == "permission_denied"
    assert (_rows(), WorkflowRun.objects.get(pk=handle.run_id).owner_epoch) == before
    assert api.as_user("both").post(path, body).status_code == 201
