"""The schedules routes over real HTTP: CRUD, pause/unpause/trigger/backfill, each error
code with nothing written, schedules declared in code, and the permissions matrix."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import requests

from django_weft import client
from django_weft.models import Schedule, WorkflowRun
from django_weft.runtime import sync_schedules

from .conftest import PASSWORD, Api, make_user

pytestmark = pytest.mark.django_db(transaction=True)

LONG = "tests.m.wait_with_timeout"  # waits for signal "go": outlives any interval here
DECLARED = "tests-nightly-report"  # declared in code by tests.scheduled_report
SCHEDULE_PERMISSIONS = [
    "view_schedule",
    "add_schedule",
    "change_schedule",
    "delete_schedule",
    "pause_schedule",
    "trigger_schedule",
]


def _error(response: requests.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}, body
    assert body["error"]["code"] == code, body
    assert body["error"]["message"]
    return dict(body["error"])


def _fields(response: requests.Response) -> set[str]:
    return set(_error(response, 400, "invalid")["details"]["fields"])


def _snapshot() -> tuple[Any, ...]:
    """Everything a schedule route can write."""
    return (
        sorted(Schedule.objects.values_list("pk", "updated_at", "paused", "note", "recent_actions")),
        WorkflowRun.objects.count(),
    )


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# -- CRUD -------------------------------------------------------------------------------------


def test_create_then_get_it_by_its_location(api: Api) -> None:
    created = api.post(
        "schedules/",
        {"id": "hourly", "workflow": "tests.echo", "args": [1], "kwargs": {"k": "v"}, "every": "1h",
         "offset": "5m", "note": "made over HTTP", "search_attributes": {"team": "ops"}},
    )  # fmt: skip
    assert created.status_code == 201, created.text
    body = created.json()
    assert created.headers["Location"] == body["url"] == api.url("schedules/hourly/")
    assert body["id"] == "hourly" and body["workflow"] == "tests.echo"
    assert (body["args"], body["kwargs"], body["search_attributes"]) == ([1], {"k": "v"}, {"team": "ops"})
    assert (body["cron"], body["every"], body["offset"], body["timezone"]) == (None, 3600.0, 300.0, "UTC")
    assert body["spec"] == "every 1h at +5m"
    assert (body["overlap"], body["catchup_window"], body["jitter"]) == ("skip", 60.0, 0.0)
    assert body["paused"] is False and body["managed"] is False and body["note"] == "made over HTTP"
    times = [_at(t) for t in body["next_fire_times"]]
    assert len(times) == 5 and times[0] == _at(body["next_fire_at"]) and times[0].minute == 5
    assert [b - a for a, b in itertools.pairwise(times)] == [timedelta(hours=1)] * 4
    assert body["recent_actions"] == [] and body["buffered"] == []
    assert (body["fired"], body["skipped"], body["missed"], body["last_missed_at"]) == (0, 0, 0, None)
    fetched = api.get(created.headers["Location"])
    assert fetched.status_code == 200 and fetched.json() == body
    assert Schedule.objects.get(pk="hourly").every_seconds == 3600


def test_create_a_paused_cron_schedule_in_a_time_zone(api: Api) -> None:
    created = api.post(
        "schedules/",
        {"id": "oslo-mornings", "workflow": "tests.echo", "cron": "0 9 * * mon-fri",
         "timezone": "Europe/Oslo", "overlap": "buffer_one", "catchup_window": 300, "jitter": "30s",
         "paused": True, "start_at": "2027-01-01T00:00:00+01:00", "end_at": "2028-01-01T00:00:00Z"},
    )  # fmt: skip
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["spec"] == "cron '0 9 * * mon-fri' in Europe/Oslo"
    assert (body["every"], body["overlap"], body["catchup_window"], body["jitter"]) == (
        None,
        "buffer_one",
        300.0,
        30.0,
    )
    assert _at(body["start_at"]) == _at("2026-12-31T23:00:00Z") and _at(body["end_at"]) == _at(
        "2028-01-01T00:00:00Z"
    )
    assert body["paused"] is True and body["next_fire_times"] == []


def test_list_filters_and_pages_by_id(api: Api) -> None:
    for name in ("c-sleepy", "a-echo", "b-echo"):
        client.create_schedule(name, "tests.sleepy" if "sleepy" in name else "tests.echo", every="1h")
    client.get_schedule_handle("b-echo").pause()
    sync_schedules()  # the schedule declared in code, managed
    every = api.get("schedules/").json()
    assert [s["id"] for s in every["results"]] == ["a-echo", "b-echo", "c-sleepy", DECLARED]
    assert every["next"] is None and every["previous"] is None
    assert every["results"][0]["url"] == api.url("schedules/a-echo/")

    def ids(query: str) -> list[str]:
        response = api.get(f"schedules/?{query}")
        assert response.status_code == 200, response.text
        return [s["id"] for s in response.json()["results"]]

    assert ids("paused=true") == ["b-echo"]
    assert ids("paused=false&workflow=tests.echo") == ["a-echo"]
    assert ids("managed=true") == [DECLARED]
    assert ids("managed=0") == ["a-echo", "b-echo", "c-sleepy"]
    assert ids("workflow=tests.nothing") == []
    assert "paused" in _fields(api.get("schedules/?paused=sometimes"))
    first = api.get("schedules/?page_size=2").json()
    assert [s["id"] for s in first["results"]] == ["a-echo", "b-echo"]
    second = api.get(first["next"]).json()
    assert [s["id"] for s in second["results"]] == ["c-sleepy", DECLARED] and second["next"] is None
    _error(api.get("schedules/?cursor=bm9wZQ"), 404, "not_found")  # a tampered cursor


def test_patch_changes_what_it_names_and_nothing_else(api: Api) -> None:
    client.create_schedule("u", "tests.echo", args=[1], every="1h", note="first")
    changed = api.patch("schedules/u/", {"cron": "30 6 * * *", "timezone": "America/New_York", "args": [2]})
    assert changed.status_code == 200, changed.text
    body = changed.json()
    assert (body["cron"], body["every"], body["args"], body["note"]) == ("30 6 * * *", None, [2], "first")
    assert _at(body["next_fire_at"]).astimezone(ZoneInfo("America/New_York")).hour == 6
    back = api.patch("schedules/u/", {"every": "15m", "overlap": "allow_all", "note": ""}).json()
    assert (back["cron"], back["every"], back["overlap"], back["note"]) == (None, 900.0, "allow_all", "")
    unchanged = api.patch("schedules/u/", {})
    assert unchanged.status_code == 200 and unchanged.json()["every"] == 900.0


def test_delete_keeps_the_runs(api: Api) -> None:
    client.create_schedule("d", "tests.echo", every="1h").trigger()
    deleted = api.delete("schedules/d/")
    assert deleted.status_code == 204 and deleted.content == b""
    assert not Schedule.objects.exists() and WorkflowRun.objects.count() == 1
    _error(api.get("schedules/d/"), 404, "not_found")
    _error(api.delete("schedules/d/"), 404, "not_found")


# -- operations -------------------------------------------------------------------------------


def test_pause_unpause(api: Api) -> None:
    client.create_schedule("p", "tests.echo", every="1h")
    paused = api.post("schedules/p/pause/", {"note": "maintenance"})
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True and paused.json()["note"] == "maintenance"
    assert paused.json()["next_fire_times"] == []
    again = api.post("schedules/p/pause/")  # no body: no note
    assert again.status_code == 200 and again.json()["note"] == ""
    unpaused = api.post("schedules/p/unpause/", {"note": "back"})
    assert unpaused.status_code == 200, unpaused.text
    assert unpaused.json()["paused"] is False and unpaused.json()["note"] == "back"
    assert len(unpaused.json()["next_fire_times"]) == 5
    assert not Schedule.objects.get(pk="p").paused


def test_trigger_fires_now_under_the_policy_or_the_one_given(api: Api) -> None:
    client.create_schedule("t", LONG, args=[3600], every="1d")
    fired = api.post("schedules/t/trigger/")
    assert fired.status_code == 200, fired.text
    action = fired.json()
    assert action["outcome"] == "started" and action["source"] == "trigger"
    run = WorkflowRun.objects.get(pk=action["run_id"])
    assert run.workflow_id == action["workflow_id"] and run.workflow_id.startswith("t-")
    skipped = api.post("schedules/t/trigger/", {"overlap": "skip"}).json()
    assert skipped["outcome"] == "skipped" and "run_id" not in skipped  # the first run is still open
    assert WorkflowRun.objects.count() == 1
    described = api.get("schedules/t/").json()
    assert described["recent_actions"][-1]["run_id"] == action["run_id"]
    assert described["recent_actions"][-1]["run_status"] in {"pending", "running", "waiting"}
    client.get_schedule_handle("t").pause()
    assert api.post("schedules/t/trigger/", {"overlap": "allow_all"}).status_code == 200  # paused: still


def test_backfill_twice_is_a_no_op(api: Api) -> None:
    client.create_schedule("b", "tests.echo", every="1h")
    body = {"start": "2027-01-01T00:00:00Z", "end": "2027-01-01T05:00:00+00:00"}
    first = api.post("schedules/b/backfill/", body)
    assert first.status_code == 200, first.text
    actions = first.json()["actions"]
    assert [a["outcome"] for a in actions] == ["started"] * 6
    assert [_at(a["scheduled_at"]).hour for a in actions] == [0, 1, 2, 3, 4, 5]
    runs = set(WorkflowRun.objects.values_list("workflow_id", flat=True))
    assert "b-2027-01-01T00:00:00Z" in runs and len(runs) == 6
    second = api.post("schedules/b/backfill/", body).json()["actions"]
    assert {a["outcome"] for a in second} == {"already_started"}
    assert [a["run_id"] for a in second] == [a["run_id"] for a in actions]
    assert set(WorkflowRun.objects.values_list("workflow_id", flat=True)) == runs
    assert Schedule.objects.get(pk="b").fired_count == 6
    empty = api.post(
        "schedules/b/backfill/", {"start": "2027-01-01T00:10:00Z", "end": "2027-01-01T00:20:00Z"}
    )
    assert empty.status_code == 200 and empty.json() == {"actions": []}


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"id": "x", "workflow": "tests.echo"}, {"cron"}),  # neither cron nor every
        ({"id": "x", "workflow": "tests.echo", "cron": "* * * * *", "every": 60}, {"cron"}),
        ({"id": "x", "workflow": "tests.echo", "cron": "61 * * * *"}, {"cron"}),
        ({"id": "x", "workflow": "tests.echo", "cron": "0 0 30 2 *"}, {"cron"}),
        ({"id": "x", "workflow": "tests.echo", "cron": "@reboot"}, {"cron"}),
        (
            {"id": "x", "workflow": "tests.echo", "cron": "* * * * *", "timezone": "Mars/Olympus"},
            {"timezone"},
        ),
        ({"id": "x", "workflow": "tests.echo", "cron": "* * * * *", "offset": 5}, {"offset"}),
        ({"id": "x", "workflow": "tests.echo", "every": "0.5s"}, {"every"}),
        ({"id": "x", "workflow": "tests.echo", "every": "soon"}, {"every"}),
        ({"id": "x", "workflow": "tests.echo", "every": True}, {"every"}),
        ({"id": "x", "workflow": "tests.echo", "every": "1h", "offset": "2h"}, {"offset"}),
        ({"id": "x", "workflow": "tests.echo", "every": 60, "jitter": -1}, {"jitter"}),
        ({"id": "x", "workflow": "tests.echo", "every": 60, "catchup_window": "forever"}, {"catchup_window"}),
        ({"id": "x", "workflow": "tests.echo", "every": 60, "overlap": "sometimes"}, {"overlap"}),
        ({"id": "x", "workflow": "tests.echo", "every": 60, "start_at": "2027-01-01T00:00:00"}, {"start_at"}),
        ({"id": "x", "workflow": "tests.echo", "every": 60, "end_at": "tomorrow"}, {"end_at"}),
        (
            {
                "id": "x",
                "workflow": "tests.echo",
                "every": 60,
                "start_at": "2027-02-01T00:00:00Z",
                "end_at": "2027-01-01T00:00:00Z",
            },
            {"end_at"},
        ),
        (
            {"id": "x", "workflow": "tests.echo", "every": 60, "args": "one", "kwargs": [1]},
            {"args", "kwargs"},
        ),
        ({"id": "x", "workflow": "tests.echo", "every": 60, "note": "a\x00b"}, {"note"}),
        ({"id": "x", "workflow": "tests.echo", "every": 60, "paused": "maybe"}, {"paused"}),
        (
            {"id": "x", "workflow": "tests.echo", "every": 60, "search_attributes": {"weft_x": 1}},
            {"search_attributes"},
        ),
        ({"id": "x", "workflow": "tests.echo", "evry": 60}, {"evry"}),  # a misspelt key is not ignored
        ({"id": "has space", "workflow": "tests.echo", "every": 60}, {"id"}),
        ({"id": "x" * 201, "workflow": "tests.echo", "every": 60}, {"id"}),
        ({"workflow": "tests.echo", "every": 60}, {"id"}),
        ({"id": "x", "every": 60}, {"workflow"}),
    ],
)
def test_bad_input_is_400_invalid_with_the_field_and_writes_nothing(
    api: Api, body: dict[str, Any], fields: set[str]
) -> None:
    before = _snapshot()
    assert _fields(api.post("schedules/", body)) == fields
    assert _snapshot() == before


def test_unknown_workflow_arguments_and_a_taken_id(api: Api) -> None:
    _error(
        api.post("schedules/", {"id": "x", "workflow": "tests.nope", "every": 60}), 400, "unknown_workflow"
    )
    mismatch = api.post("schedules/", {"id": "x", "workflow": "tests.countdown", "every": 60})  # n missing
    _error(mismatch, 400, "invalid")
    assert not Schedule.objects.exists()
    client.create_schedule("taken", "tests.echo", every=60)
    before = _snapshot()
    taken = _error(
        api.post("schedules/", {"id": "taken", "workflow": "tests.echo", "every": 120}), 409, "already_exists"
    )
    assert "taken" in taken["message"]
    _error(api.post("schedules/", [1, 2]), 400, "invalid")
    malformed = requests.post(
        api.url("schedules/"),
        data=b'{"id": ',
        headers={"Content-Type": "application/json"},
        auth=api.auth,
        timeout=10,
    )
    _error(malformed, 400, "invalid")
    assert _snapshot() == before


def test_bad_changes_and_operations_write_nothing(api: Api) -> None:
    client.create_schedule("s", "tests.echo", every="1h")
    before = _snapshot()
    assert _fields(api.patch("schedules/s/", {"cron": "nope"})) == {"cron"}
    assert _fields(api.patch("schedules/s/", {"every": None})) == {"cron"}  # then it has neither
    assert _fields(api.patch("schedules/s/", {"args": None, "catchup_window": None})) == {
        "args",
        "catchup_window",
    }
    paused = _error(api.patch("schedules/s/", {"paused": True}), 400, "invalid")
    assert "pause/" in paused["details"]["fields"]["paused"][0]
    assert _fields(api.patch("schedules/s/", {"id": "t"})) == {"id"}
    _error(api.patch("schedules/s/", {"workflow": "tests.nope"}), 400, "unknown_workflow")
    assert _fields(api.post("schedules/s/pause/", {"note": ["x"], "colour": "red"})) == {"note", "colour"}
    assert _fields(api.post("schedules/s/trigger/", {"overlap": "sometimes"})) == {"overlap"}
    assert _fields(api.post("schedules/s/backfill/", {})) == {"start", "end"}
    naive = {"start": "2027-01-01T00:00:00", "end": "2027-01-02T00:00:00"}
    assert _fields(api.post("schedules/s/backfill/", naive)) == {"start", "end"}
    backwards = {"start": "2027-01-02T00:00:00Z", "end": "2027-01-01T00:00:00Z"}
    assert _fields(api.post("schedules/s/backfill/", backwards)) == {"end"}
    out_of_range = {"start": "0001-01-01T00:00:00+01:00", "end": "2027-01-01T00:00:00Z"}
    assert _fields(api.post("schedules/s/backfill/", out_of_range)) == {"start"}
    _error(api.delete("schedules/s/?force=perhaps"), 400, "invalid")
    _error(
        requests.put(api.url("schedules/s/"), json={}, auth=api.auth, timeout=10), 405, "method_not_allowed"
    )
    assert _snapshot() == before


def test_a_backfill_of_too_many_times_starts_nothing(api: Api) -> None:
    client.create_schedule("busy", "tests.echo", every="1s")
    before = _snapshot()
    over = {"start": "2027-01-01T00:00:00Z", "end": "2027-01-01T00:08:20Z"}  # 501 seconds
    refused = _error(api.post("schedules/busy/backfill/", over), 400, "invalid")
    assert "more than 500 scheduled times" in refused["details"]["fields"]["end"][0]
    assert _snapshot() == before
    within = api.post("schedules/busy/backfill/", {**over, "end": "2027-01-01T00:08:19Z"})
    assert within.status_code == 200 and len(within.json()["actions"]) == WorkflowRun.objects.count() == 500


@pytest.mark.parametrize("schedule_id", ["missing", "has space", "x" * 300, "-lead", "a.b"])
def test_every_route_of_a_schedule_that_is_not_there_is_404(api: Api, schedule_id: str) -> None:
    before = _snapshot()
    for response in [
        api.get(f"schedules/{schedule_id}/"),
        api.patch(f"schedules/{schedule_id}/", {"note": "x"}),
        api.delete(f"schedules/{schedule_id}/"),
        api.post(f"schedules/{schedule_id}/pause/"),
        api.post(f"schedules/{schedule_id}/unpause/"),
        api.post(f"schedules/{schedule_id}/trigger/"),
        api.post(
            f"schedules/{schedule_id}/backfill/",
            {"start": "2027-01-01T00:00:00Z", "end": "2027-01-01T00:00:00Z"},
        ),
    ]:
        _error(response, 404, "not_found")
    assert _snapshot() == before


# -- schedules declared in code ------------------------------------------------------------------


def test_a_schedule_declared_in_code_changes_in_code_only(api: Api) -> None:
    sync_schedules()
    assert api.get(f"schedules/{DECLARED}/").json()["managed"] is True
    before = _snapshot()
    for changes in ({"cron": "0 3 * * *"}, {"workflow": "tests.echo"}, {"args": ["weekly"], "note": "x"}):
        refused = _error(api.patch(f"schedules/{DECLARED}/", changes), 409, "conflict")
        assert "declared in code" in refused["message"] and "weft_schedules sync" in refused["message"]
        assert refused["details"] == {"schedule_id": DECLARED, "declared": sorted(set(changes) - {"note"})}
    kept = _error(api.delete(f"schedules/{DECLARED}/"), 409, "conflict")
    assert "?force=true" in kept["message"] and "--prune" in kept["message"]
    assert _snapshot() == before
    # What stays the operators': the note, pausing, triggers and backfills.
    assert api.patch(f"schedules/{DECLARED}/", {"note": "watched"}).json()["note"] == "watched"
    assert api.post(f"schedules/{DECLARED}/pause/", {"note": "quiet week"}).json()["paused"] is True
    assert api.post(f"schedules/{DECLARED}/unpause/").json()["paused"] is False
    assert api.post(f"schedules/{DECLARED}/trigger/").json()["outcome"] == "started"
    backfilled = api.post(
        f"schedules/{DECLARED}/backfill/", {"start": "2027-01-01T00:00:00Z", "end": "2027-01-03T00:00:00Z"}
    )
    assert [a["outcome"] for a in backfilled.json()["actions"]] == ["started", "started"]
    assert Schedule.objects.get(pk=DECLARED).cron == "0 2 * * *"
    assert api.delete(f"schedules/{DECLARED}/?force=true").status_code == 204
    assert not Schedule.objects.exists()


# -- permissions ------------------------------------------------------------------------------

# (method, route, body, the permission it needs, the status it answers when allowed)
MUTATING: list[tuple[str, str, dict[str, Any] | None, str, int]] = [
    ("post", "schedules/", {"id": "new", "workflow": "tests.echo", "every": 60}, "add_schedule", 201),
    ("patch", "schedules/s/", {"every": 120}, "change_schedule", 200),
    ("delete", "schedules/s/", None, "delete_schedule", 204),
    ("post", "schedules/s/pause/", {"note": "n"}, "pause_schedule", 200),
    ("post", "schedules/s/unpause/", None, "pause_schedule", 200),
    ("post", "schedules/s/trigger/", None, "trigger_schedule", 200),
    (
        "post",
        "schedules/s/backfill/",
        {"start": "2027-01-01T00:00:00Z", "end": "2027-01-01T00:00:00Z"},
        "trigger_schedule",
        200,
    ),
]


@pytest.mark.parametrize(
    ("method", "route", "body", "permission", "allowed"), MUTATING, ids=[f"{m[0]} {m[1]}" for m in MUTATING]
)
def test_each_mutating_route_needs_staff_and_its_permission(
    api: Api, method: str, route: str, body: dict[str, Any] | None, permission: str, allowed: int
) -> None:
    client.create_schedule("s", "tests.echo", every="1h")
    make_user("someone", staff=False, permissions=[permission])
    make_user("staff-without", staff=True, permissions=[p for p in SCHEDULE_PERMISSIONS if p != permission])
    make_user("viewer", staff=True, permissions=["view_schedule"])
    make_user("staff-with", staff=True, permissions=[permission])

    def call(username: str | None) -> requests.Response:
        caller = api.as_user(username)
        return caller.delete(route) if method == "delete" else getattr(caller, method)(route, body)

    before = _snapshot()
    _error(call(None), 401, "not_authenticated")
    for username in ("someone", "staff-without", "viewer"):
        _error(call(username), 403, "permission_denied")
    assert _snapshot() == before, "a refused request changed something"
    granted = call("staff-with")
    assert granted.status_code == allowed, granted.text


def test_reads_need_view_schedule_and_schedules_and_runs_have_separate_permissions(api: Api) -> None:
    client.create_schedule("s", "tests.echo", every="1h")
    make_user("viewer", staff=True, permissions=["view_schedule"])
    make_user(
        "all-but-view", staff=True, permissions=[p for p in SCHEDULE_PERMISSIONS if p != "view_schedule"]
    )
    make_user("runs-only", staff=True, permissions=["view_workflowrun", "add_workflowrun"])
    make_user("not-staff", staff=False, permissions=SCHEDULE_PERMISSIONS)
    for route in ("schedules/", "schedules/s/", "schedules/?paused=true"):
        _error(api.as_user(None).get(route), 401, "not_authenticated")
        for username in ("all-but-view", "runs-only", "not-staff"):
            _error(api.as_user(username).get(route), 403, "permission_denied")
        assert api.as_user("viewer").get(route).status_code == 200, route
    described = requests.options(api.url("schedules/"), auth=("viewer", PASSWORD), timeout=10)
    assert described.status_code == 200 and described.json()["name"] == "Schedule List"
    _error(api.as_user("viewer").get("runs/"), 403, "permission_denied")
    assert api.as_user("runs-only").get("runs/").status_code == 200
    _error(
        api.as_user("runs-only").post("schedules/", {"id": "n", "workflow": "tests.echo", "every": 60}),
        403,
        "permission_denied",
    )
