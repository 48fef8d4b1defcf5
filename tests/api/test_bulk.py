"""``POST runs/bulk/`` and ``GET runs/bulk/{job_id}/`` over real HTTP: a dry run counts what
the list shows for the same filter; a job is stored at once and the tick works through
it, with an outcome per run; permissions, the run filter and bad input."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.test import override_settings

from django_weft import client
from django_weft.models import BulkJob, WorkflowRun
from django_weft.runtime import tick
from django_weft.runtime.dispatch import SweepOnlyDispatcher
from django_weft.testing import drive
from tests.support.driver import park

from .conftest import Api, make_user

pytestmark = pytest.mark.django_db(transaction=True)

WAITS = "tests.m.wait_with_timeout"
GOLD_ONLY = "tests.api.test_permissions.only_gold"


def sleeping(workflow_id: str, **attributes: Any) -> str:
    """A run started and not driven yet: running."""
    return client.start(
        "tests.sleepy", kwargs={"seconds": 3600}, id=workflow_id, search_attributes=attributes
    ).run_id


def waiting(workflow_id: str, **attributes: Any) -> str:
    handle = client.start(WAITS, args=[3600], id=workflow_id, search_attributes=attributes)
    park(handle.run_id)
    return handle.run_id


def finished(workflow: str, workflow_id: str, **attributes: Any) -> str:
    handle = client.start(workflow, id=workflow_id, search_attributes=attributes)
    drive(handle.run_id)
    return handle.run_id


def listed(api: Api, spec: dict[str, Any]) -> list[str]:
    """Every run id ``GET runs/`` lists for the filter (each value a query parameter,
    a list repeating it), following the pages."""
    params: list[tuple[str, str]] = [("page_size", "500")]
    for key, value in spec.items():
        for item in value if isinstance(value, list) else [value]:
            params.append((key, item if isinstance(item, str) else str(item).lower()))
    response = api.get("runs/", params=params)
    assert response.status_code == 200, response.text
    ids = [run["run_id"] for run in response.json()["results"]]
    next_url = response.json()["next"]
    while next_url:
        page = api.get(next_url).json()
        ids += [run["run_id"] for run in page["results"]]
        next_url = page["next"]
    return ids


def count(api: Api, action: str, spec: dict[str, Any]) -> int:
    response = api.post("runs/bulk/", {"action": action, "filter": spec, "dry_run": True})
    assert response.status_code == 200, response.text
    assert set(response.json()) == {"count"}
    return int(response.json()["count"])


def tick_until_done(api: Api, url: str) -> dict[str, Any]:
    """Run the tick (as a beat or weft_worker would) until the job is finished; its last state."""
    for _ in range(200):
        tick(SweepOnlyDispatcher())
        job = api.get(url).json()
        if job["status"] in ("completed", "failed"):
            return dict(job)
    raise AssertionError("the job did not finish")


def status(run_id: str) -> str:
    return WorkflowRun.objects.get(pk=run_id).status


def test_a_dry_run_counts_what_the_list_shows_for_the_same_filter(api: Api) -> None:
    parent = client.start("tests.c.parent", args=["family", 3600], id="family")
    park(parent.run_id)
    for i in range(3):
        sleeping(f"sleepy-{i}", customer=7, tier="gold")
    sleeping("sleepy-str", customer="7", tier="basic")
    sleeping("sleepy-other", customer=8)
    middle = datetime.now(UTC)
    time.sleep(0.01)
    for i in range(2):
        waiting(f"waits-{i}", customer=7)
    finished("tests.echo", "echo-1", tier="gold")
    finished("tests.raises", "raises-1")

    # The filter, and how many of the runs above it matches (the parent's child is running).
    filters: list[tuple[dict[str, Any], int]] = [
        ({"status": "running"}, 6),
        ({"status": ["waiting", "failed"]}, 4),
        ({"workflow": "tests.sleepy"}, 5),
        ({"workflow_id": "sleepy-1"}, 1),
        ({"search.customer": 7}, 6),  # the number 7 and the string "7"
        ({"search.customer": "7"}, 6),
        ({"search.tier": "gold", "status": ["running", "completed"]}, 4),
        ({"search.customer": [7, "7"]}, 6),
        ({"created_after": middle.isoformat()}, 4),
        ({"created_before": middle.isoformat(), "workflow": "tests.sleepy"}, 5),
        ({"parent": parent.run_id}, 1),
        ({"workflow": "nothing.like.this"}, 0),
    ]
    for spec, expected in filters:
        assert len(listed(api, spec)) == expected, spec
        assert count(api, "cancel", spec) == expected, spec
        assert count(api, "resume", spec) == expected, spec  # the action does not narrow it
    assert not BulkJob.objects.exists()
    assert WorkflowRun.objects.filter(status="cancelled").count() == 0


def test_cancelling_a_thousand_runs_by_filter_completes_with_an_outcome_per_run(api: Api) -> None:
    matching = [sleeping(f"big-{i}", lot="big") for i in range(990)]
    finishing = [
        client.start("tests.echo", id=f"big-echo-{i}", search_attributes={"lot": "big"}).run_id
        for i in range(10)
    ]
    others = [sleeping(f"small-{i}", lot="small") for i in range(5)]
    spec = {"search.lot": "big"}
    assert count(api, "cancel", spec) == len(listed(api, spec)) == 1000

    response = api.post("runs/bulk/", {"action": "cancel", "filter": spec, "reason": "lot recalled"})

    assert response.status_code == 202, response.text
    body = response.json()
    job = body["job"]
    assert body["url"] == job["url"] == response.headers["Location"]
    assert job["url"].endswith(f"/api/weft/runs/bulk/{job['id']}/")
    assert (job["status"], job["action"], job["matched"], job["done"], job["reason"]) == (
        "pending",
        "cancel",
        1000,
        0,
        "lot recalled",
    )
    assert job["filter"] == {"search.lot": ["big"]} and job["created_by"] == "ops"
    assert all(status(run_id) == "running" for run_id in matching[:10])  # nothing yet

    # Meanwhile runs change: three are cancelled by hand, ten finish.
    for run_id in matching[:3]:
        client.get_handle(run_id).cancel(reason="by hand")
    for run_id in finishing:
        drive(run_id)
    tick(SweepOnlyDispatcher())
    progress = api.get(job["url"]).json()
    assert progress["status"] == "running" and 0 < progress["done"] + progress["skipped"] < 1000

    final = tick_until_done(api, job["url"])

    assert final["status"] == "completed" and final["finished_at"] is not None
    assert (final["done"], final["skipped"], final["failed"]) == (987, 13, 0)
    reasons = {entry["reason"]: entry for entry in final["skipped_reasons"]}
    assert set(reasons) == {"already finished (cancelled)", "already finished (completed)"}
    assert reasons["already finished (cancelled)"]["count"] == 3
    assert sorted(reasons["already finished (cancelled)"]["run_ids"]) == sorted(matching[:3])
    assert sorted(reasons["already finished (completed)"]["run_ids"]) == sorted(finishing)
    assert final["failures"] == [] and final["error"] == ""
    cancelled = WorkflowRun.objects.filter(pk__in=matching[3:])
    assert cancelled.filter(status="cancelled", error__reason="lot recalled").count() == 987
    assert all(status(run_id) == "running" for run_id in others)


def test_each_action_needs_its_permission_and_view(api: Api) -> None:
    run_id = waiting("guarded")
    make_user("viewer", staff=True, permissions=["view_workflowrun"])
    make_user("canceller", staff=True, permissions=["view_workflowrun", "cancel_workflowrun"])
    make_user("suspender", staff=True, permissions=["view_workflowrun", "suspend_workflowrun"])
    make_user("blind", staff=True, permissions=["cancel_workflowrun", "suspend_workflowrun"])
    spec = {"workflow_id": "guarded"}

    def post(user: str | None, action: str, dry_run: bool = False) -> int:
        body = {"action": action, "filter": spec, "dry_run": dry_run}
        return api.as_user(user).post("runs/bulk/", body).status_code

    assert post(None, "cancel") == 401
    for action in ("cancel", "terminate", "retry", "suspend", "resume"):
        assert post("viewer", action) == 403
        assert post("viewer", action, dry_run=True) == 403
        assert post("blind", action, dry_run=True) == 403
    for action in ("suspend", "resume"):
        assert post("canceller", action) == 403
    for action in ("cancel", "terminate", "retry"):
        assert post("suspender", action) == 403
    assert not BulkJob.objects.exists()

    assert post("suspender", "suspend", dry_run=True) == 200
    assert post("canceller", "terminate", dry_run=True) == 200
    started = api.as_user("suspender").post("runs/bulk/", {"action": "suspend", "filter": spec})
    assert started.status_code == 202, started.text
    url = started.json()["url"]
    assert api.as_user("viewer").get(url).status_code == 200
    assert api.as_user("blind").get(url).status_code == 403
    assert api.as_user(None).get(url).status_code == 401
    tick_until_done(api, url)
    assert status(run_id) == "suspended"


def by_header(request: Any, queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
    """A run filter that reads a header: it cannot be applied without the request."""
    tier = request.headers.get("X-Tier") if hasattr(request, "headers") else None
    return queryset.filter(search_attributes__tier=tier) if tier else queryset


def test_the_run_filter_limits_the_count_the_job_and_who_sees_the_job(api: Api) -> None:
    gold = [sleeping(f"gold-{i}", tier="gold") for i in range(3)]
    basic = [sleeping(f"basic-{i}", tier="basic") for i in range(2)]
    make_user("other-ops", staff=True, permissions=["view_workflowrun", "cancel_workflowrun"])
    spec = {"workflow": "tests.sleepy"}
    with override_settings(WEFT_API_RUN_FILTER=GOLD_ONLY):
        assert count(api, "cancel", spec) == len(listed(api, spec)) == 3
        response = api.post("runs/bulk/", {"action": "cancel", "filter": spec})
        assert response.status_code == 202, response.text
        url = response.json()["url"]
        assert response.json()["job"]["matched"] == 3
        final = tick_until_done(api, url)
        assert (final["done"], final["skipped"]) == (3, 0)
        # Another user with the same rights does not see this user's job.
        hidden = api.as_user("other-ops").get(url)
        assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "not_found"
    assert all(status(run_id) == "cancelled" for run_id in gold)
    assert all(status(run_id) == "running" for run_id in basic)


def by_session(request: Any, queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
    """A run filter that reads the session (which a stand-in request has not got)."""
    return queryset.exclude(workflow_id="basic") if request.session is not None else queryset.none()


@pytest.mark.parametrize("run_filter", ["by_header", "by_session"])
def test_a_job_is_refused_when_the_run_filter_needs_more_than_the_user(api: Api, run_filter: str) -> None:
    sleeping("gold", tier="gold")
    sleeping("basic", tier="basic")
    with override_settings(WEFT_API_RUN_FILTER=f"tests.api.test_bulk.{run_filter}"):
        headers = {"X-Tier": "gold"}
        body = {"action": "cancel", "filter": {"workflow": "tests.sleepy"}}
        assert api.post("runs/bulk/", {**body, "dry_run": True}, headers=headers).json() == {"count": 1}
        refused = api.post("runs/bulk/", body, headers=headers)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "permission_denied"
        assert "request.user only" in refused.json()["error"]["message"]
        assert not BulkJob.objects.exists()
    assert WorkflowRun.objects.filter(status="running").count() == 2


def test_a_job_whose_creator_was_deactivated_fails_and_changes_nothing(api: Api) -> None:
    run_id = sleeping("kept", tier="gold")
    with override_settings(WEFT_API_RUN_FILTER=GOLD_ONLY):
        response = api.post("runs/bulk/", {"action": "cancel", "filter": {"workflow_id": "kept"}})
        assert response.status_code == 202
        get_user_model().objects.filter(username="ops").update(is_active=False)
        tick(SweepOnlyDispatcher())
        job = BulkJob.objects.get()
    assert job.status == "failed" and "'ops', is no longer active" in job.error
    assert status(run_id) == "running"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"action": "explode", "filter": {"status": "running"}}, "action"),
        ({"filter": {"status": "running"}}, "action"),
        ({"action": "cancel"}, "filter"),
        ({"action": "cancel", "filter": {}}, "filter"),
        ({"action": "cancel", "filter": ["status"]}, "filter"),
        ({"action": "cancel", "filter": {"stauts": "running"}}, "filter"),
        ({"action": "cancel", "filter": {"page_size": "5"}}, "filter"),
        ({"action": "cancel", "filter": {"status": "bogus"}}, "filter"),
        ({"action": "cancel", "filter": {"status": []}}, "filter"),
        ({"action": "cancel", "filter": {"created_after": "yesterday"}}, "filter"),
        ({"action": "cancel", "filter": {"parent": "not-a-uuid"}}, "filter"),
        ({"action": "cancel", "filter": {"search.a__b": "x"}}, "filter"),
        ({"action": "cancel", "filter": {"search.customer": {"id": 7}}}, "filter"),
        ({"action": "cancel", "filter": {"search.customer": None}}, "filter"),
        ({"action": "cancel", "filter": {"search.customer": "a\x00"}}, "filter"),
        ({"action": "cancel", "filter": {"workflow": "a\x00"}}, "filter"),
        ({"action": "cancel", "filter": {"workflow": "a\ud800"}}, "filter"),
        ({"action": "suspend", "filter": {"status": "running"}, "reason": "why"}, "reason"),
        ({"action": "cancel", "filter": {"status": "running"}, "reason": "a\x00"}, "reason"),
        ({"action": "cancel", "filter": {"status": "running"}, "dry_run": "maybe"}, "dry_run"),
        ({"action": "cancel", "filter": {"status": "running"}, "filters": {}}, "filters"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_changes_nothing(
    api: Api, body: dict[str, Any], field: str
) -> None:
    run_id = sleeping("untouched")
    for dry_run in (False, True):
        response = api.post("runs/bulk/", {**body, "dry_run": dry_run} if "dry_run" not in body else body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid" and field in error["details"]["fields"], error
    assert not BulkJob.objects.exists()
    assert status(run_id) == "running"


def test_an_unknown_filter_key_is_named_with_the_known_ones(api: Api) -> None:
    response = api.post("runs/bulk/", {"action": "cancel", "filter": {"stauts": "running"}})
    assert response.json()["error"]["details"]["fields"] == {
        "filter": {
            "stauts": [
                "Unknown filter; use status, workflow, workflow_id, parent, created_after, created_before, "
                "concurrency_key, kind, queued or search.<attr>."
            ]
        }
    }


def test_an_unknown_job_is_a_404_and_the_route_has_no_list(api: Api) -> None:
    for ref in (str(uuid.uuid4()), "not-a-uuid"):
        response = api.get(f"runs/bulk/{ref}/")
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    listing = api.get("runs/bulk/")
    assert listing.status_code == 405 and listing.json()["error"]["code"] == "method_not_allowed"


def test_request_cancel_sends_each_matching_run_a_request_its_workflow_receives(api: Api) -> None:
    runs = [waiting(f"req-{i}", lot="req") for i in range(3)]
    untouched = waiting("req-other", lot="other")
    response = api.post(
        "runs/bulk/", {"action": "request_cancel", "filter": {"search.lot": "req"}, "reason": "recall"}
    )
    assert response.status_code == 202, response.text
    final = tick_until_done(api, response.json()["url"])
    assert (final["done"], final["skipped"], final["failed"]) == (3, 0, 0)
    for run_id in runs:
        run = WorkflowRun.objects.get(pk=run_id)
        # A request, not an immediate cancel: stored for the workflow to receive.
        assert run.cancel_request is not None and run.cancel_request["reason"] == "recall"
        drive(run_id)
        assert status(run_id) == "cancelled"
    assert WorkflowRun.objects.get(pk=untouched).cancel_request is None
