"""Flow control over real HTTP: a run's priority, concurrency key and slot; the list's
``concurrency_key`` and ``queued`` filters (and a bulk job's, which the tick reads the
same way); ``priority`` on a start, checked as the runtime checks it; a start refused by
``on_limit="cancel_new"`` (409 ``concurrency_limited``) or answered by the run holding the
key (``skip``); a holder outside ``WEFT_API_RUN_FILTER`` never named. On both databases."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from django_weft import client
from django_weft.models import BulkJob, WorkflowRun
from django_weft.runtime.process import get_engine
from django_weft.runtime.run_sources import runs_listed

from .conftest import Api
from .test_bulk import count, listed, tick_until_done

pytestmark = pytest.mark.django_db(transaction=True)

GOLD_ONLY = "tests.api.test_permissions.only_gold"


def turn(run_id: str) -> str:
    return str(get_engine().run_turn(run_id))


def start(api: Api, workflow: str, *args: Any, expect: int = 201, **body: Any) -> dict[str, Any]:
    response = api.post("runs/", {"workflow": workflow, "args": list(args), **body})
    assert response.status_code == expect, response.text
    return dict(response.json())


def holder_and_queued(api: Api, key: str, queued: int = 1) -> tuple[str, list[str]]:
    """A run of ``tests.flow.per_key`` holding ``key``'s one slot, and ``queued`` runs
    queued for it (each claimed once, so queued by the claim)."""
    holder = start(api, "tests.flow.per_key", key)["run_id"]
    assert turn(holder) == "parked"
    waiting = [start(api, "tests.flow.per_key", key)["run_id"] for _ in range(queued)]
    for run_id in waiting:
        assert turn(run_id) == "not_claimed"
    return holder, waiting


def test_a_run_shows_its_priority_its_key_and_its_slot(api: Api) -> None:
    first = start(api, "tests.flow.per_key", "c-1", priority=7)
    assert (first["priority"], first["concurrency_key"], first["slot"]) == (7, "c-1", "held")
    assert turn(first["run_id"]) == "parked"
    second = start(api, "tests.flow.per_key", "c-1", priority=-3)
    assert (second["status"], second["slot"]) == ("pending", "queued")  # queued at start
    assert turn(second["run_id"]) == "not_claimed"
    # A delayed start takes its slot, or its place in the queue, once it is due.
    delayed = start(api, "tests.flow.per_key", "c-1", start_delay="1h")
    assert (delayed["status"], delayed["slot"]) == ("pending", "")

    holding = api.get(f"runs/{first['run_id']}/").json()
    assert (holding["status"], holding["slot"]) == ("waiting", "held")
    queued = api.get(f"runs/{second['run_id']}/").json()
    assert (queued["status"], queued["slot"], queued["priority"]) == ("pending", "queued", -3)
    assert queued["waiting_on"]["kind"] == "concurrency"
    assert queued["waiting_on"]["text"] == "queued: concurrency key c-1 (1 of 1 in use)"

    plain = start(api, "tests.echo")
    assert (plain["priority"], plain["concurrency_key"], plain["slot"]) == (0, None, "")
    assert start(api, "tests.flow.one", "x")["concurrency_key"] == ""

    # A finished run holds no slot, whatever its row's column kept.
    cancelled = api.post(f"runs/{first['run_id']}/cancel/").json()["run"]
    assert (cancelled["status"], cancelled["slot"]) == ("cancelled", "")
    assert WorkflowRun.objects.get(pk=first["run_id"]).slot == "held"
    listed_runs = {run["run_id"]: run for run in api.get("runs/").json()["results"]}
    assert listed_runs[first["run_id"]]["slot"] == "" and listed_runs[second["run_id"]]["slot"] == "queued"


@pytest.mark.parametrize("priority", [-100, 100])
def test_the_ends_of_the_priority_range_are_taken(api: Api, priority: int) -> None:
    run = start(api, "tests.echo", priority=priority)
    assert WorkflowRun.objects.get(pk=run["run_id"]).priority == priority


@pytest.mark.parametrize("priority", [101, -101, 2**63, 1.5, 1.0, True, "5", "", None, [1], {"a": 1}])
def test_a_bad_priority_is_400_naming_it_and_nothing_is_written(api: Api, priority: Any) -> None:
    response = api.post("runs/", {"workflow": "tests.echo", "id": "prio", "priority": priority})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid" and set(error["details"]["fields"]) == {"priority"}, error
    if priority is not None:  # null is DRF's own "may not be null"
        assert "priority must be a whole number from -100 to 100" in error["details"]["fields"]["priority"][0]
    assert not WorkflowRun.objects.exists()


def test_the_list_filters_by_concurrency_key_and_by_queued(api: Api) -> None:
    holder, queued = holder_and_queued(api, "c-1", queued=2)
    other, other_queued = holder_and_queued(api, "c-2")
    plain = start(api, "tests.echo")["run_id"]

    assert sorted(listed(api, {"queued": "true"})) == sorted([*queued, *other_queued])
    assert sorted(listed(api, {"queued": "false"})) == sorted([holder, other, plain])
    assert sorted(listed(api, {"concurrency_key": "c-1"})) == sorted([holder, *queued])
    assert listed(api, {"concurrency_key": "c-1", "queued": "false"}) == [holder]
    assert listed(api, {"concurrency_key": "nobody"}) == []
    # A queued run that is cancelled is no longer queued.
    api.post(f"runs/{queued[0]}/cancel/")
    assert sorted(listed(api, {"queued": "1"})) == sorted([queued[1], *other_queued])
    assert queued[0] in listed(api, {"queued": "0"})

    refused = api.get("runs/", params={"queued": "maybe"})
    assert refused.status_code == 400
    assert set(refused.json()["error"]["details"]["fields"]) == {"queued"}


def test_a_bulk_job_reads_the_flow_filters_as_the_list_does(api: Api) -> None:
    holder, queued = holder_and_queued(api, "c-1", queued=2)
    other, other_queued = holder_and_queued(api, "c-2")
    specs: list[dict[str, Any]] = [
        {"queued": True},
        {"queued": False},
        {"queued": "0"},
        {"concurrency_key": "c-1"},
        {"concurrency_key": "c-2", "queued": True},
        {"concurrency_key": ""},
        {"queued": ""},
    ]
    for spec in specs:
        texts = {
            key: [str(value).lower() if isinstance(value, bool) else str(value)]
            for key, value in spec.items()
        }
        selected = {
            str(pk) for pk in runs_listed(WorkflowRun.objects.all(), texts).values_list("pk", flat=True)
        }
        assert set(listed(api, texts)) == selected, spec
        assert count(api, "cancel", spec) == len(selected), spec

    # Cancel what waits for customer c-1's slot; its holder and c-2 are left alone.
    response = api.post(
        "runs/bulk/", {"action": "cancel", "filter": {"concurrency_key": "c-1", "queued": True}}
    )
    assert response.status_code == 202, response.text
    job = tick_until_done(api, response.json()["url"])
    assert (job["status"], job["matched"], job["done"]) == ("completed", 2, 2)
    statuses = dict(WorkflowRun.objects.values_list("pk", "status"))
    assert {str(pk): status for pk, status in statuses.items()} == {
        holder: "waiting",
        queued[0]: "cancelled",
        queued[1]: "cancelled",
        other: "waiting",
        other_queued[0]: "pending",
    }

    refused = api.post("runs/bulk/", {"action": "cancel", "filter": {"queued": "perhaps"}, "dry_run": True})
    assert refused.status_code == 400 and "filter" in refused.json()["error"]["details"]["fields"]
    assert BulkJob.objects.count() == 1


def test_cancel_new_answers_409_concurrency_limited_naming_the_holder_and_writes_nothing(api: Api) -> None:
    first = start(api, "tests.flow.refuse", "c-1")
    before = list(WorkflowRun.objects.values_list("pk", "status", "updated_at"))
    response = api.post("runs/", {"workflow": "tests.flow.refuse", "args": ["c-1"], "id": "second"})
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "concurrency_limited"
    assert error["details"] == {
        "workflow": "tests.flow.refuse",
        "key": "c-1",
        "limit": 1,
        "run_id": first["run_id"],
    }
    assert "on_limit='cancel_new'" in error["message"]
    assert list(WorkflowRun.objects.values_list("pk", "status", "updated_at")) == before
    start(api, "tests.flow.refuse", "c-2")  # another key has a slot of its own


def test_skip_answers_200_with_the_run_holding_the_key(api: Api) -> None:
    first = start(api, "tests.flow.singleton", "c-1")
    response = api.post("runs/", {"workflow": "tests.flow.singleton", "args": ["c-1"]})
    assert response.status_code == 200, response.text
    assert "Location" not in response.headers
    assert response.json()["run_id"] == first["run_id"]
    assert response.json()["concurrency_key"] == "c-1"
    assert WorkflowRun.objects.count() == 1


def test_a_holder_outside_the_run_filter_is_never_named(api: Api) -> None:
    hidden = client.start("tests.flow.refuse", args=["c-1"], search_attributes={"tier": "basic"})
    client.start("tests.flow.singleton", args=["c-1"], search_attributes={"tier": "basic"})
    before = WorkflowRun.objects.count()
    with override_settings(WEFT_API_RUN_FILTER=GOLD_ONLY):
        for workflow in ("tests.flow.refuse", "tests.flow.singleton"):
            body = {"workflow": workflow, "args": ["c-1"], "search_attributes": {"tier": "gold"}}
            response = api.post("runs/", body)
            assert response.status_code == 409, response.text
            error = response.json()["error"]
            assert error["code"] == "concurrency_limited"
            assert error["details"] == {"workflow": workflow, "key": "c-1", "limit": 1, "run_id": None}
            assert hidden.run_id not in response.text
        # A visible holder is named as usual.
        mine = start(api, "tests.flow.refuse", "c-2", search_attributes={"tier": "gold"})
        again = api.post(
            "runs/", {"workflow": "tests.flow.refuse", "args": ["c-2"], "search_attributes": {"tier": "gold"}}
        )
        assert again.json()["error"]["details"]["run_id"] == mine["run_id"]
    assert WorkflowRun.objects.count() == before + 1


def test_the_schema_describes_priority_the_flow_fields_and_filters_and_the_409(api: Api) -> None:
    schema = api.get("schema/?format=json").json()
    components = schema["components"]["schemas"]
    priority = components["StartRunRequest"]["properties"]["priority"]
    assert (priority["type"], priority["minimum"], priority["maximum"], priority["default"]) == (
        "integer",
        -100,
        100,
        0,
    )
    run = components["Run"]["properties"]
    assert run["priority"]["type"] == "integer"
    assert run["concurrency_key"]["nullable"] is True
    # drf-spectacular writes an enum with "" as two: the values, and the blank one.
    slots = [
        value for ref in run["slot"]["oneOf"] for value in components[ref["$ref"].rsplit("/", 1)[1]]["enum"]
    ]
    assert sorted(slots) == ["", "held", "queued"]
    assert {"priority", "concurrency_key", "slot"} <= set(components["Run"]["required"])
    listing = schema["paths"]["/api/weft/runs/"]["get"]["parameters"]
    assert {"concurrency_key", "queued"} <= {parameter["name"] for parameter in listing}
    starting = schema["paths"]["/api/weft/runs/"]["post"]
    assert "409" in starting["responses"] and "concurrency_limited" in starting["description"]
