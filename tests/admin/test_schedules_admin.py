"""The schedules' admin with Django's test client: the list, the pause/unpause/trigger/
delete actions (confirmation, outcome message, admin history, permissions, all matching
the filter), the add and change form (through the runtime; bad input is an error on its
field and writes nothing), a schedule declared in code (read-only but its note), a
schedule's page (next fire times, recent actions, runs) and the Backfill tool. Schedules
and runs are real: made through the client and fired by triggers and the tick."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from html import unescape
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.messages import get_messages
from django.test import Client, override_settings
from django.urls import reverse

from django_weft import client, runtime
from django_weft.engine.registry import registry
from django_weft.models import Schedule, WorkflowRun
from django_weft.runtime import fire_due_schedules, get_store
from django_weft.testing import drive

from .conftest import logged_in

pytestmark = pytest.mark.django_db(transaction=True)

VIEW = ("view_schedule",)
PAUSE = ("view_schedule", "pause_schedule")
TRIGGER = ("view_schedule", "trigger_schedule", "view_workflowrun")
ACTION_PERMISSIONS = {
    "pause_schedules": "pause_schedule",
    "unpause_schedules": "pause_schedule",
    "trigger_schedules": "trigger_schedule",
    "delete_schedules": "delete_schedule",
}
LONG = "tests.m.wait_with_timeout"  # waits for signal "go": its run stays open
DECLARED = "tests-nightly-report"  # declared in code by tests.scheduled_report


def list_url(query: str = "") -> str:
    url = reverse("admin:django_weft_schedule_changelist")
    return f"{url}?{query}" if query else url


def change_url(schedule_id: str) -> str:
    return reverse("admin:django_weft_schedule_change", args=[schedule_id])


def add_url() -> str:
    return reverse("admin:django_weft_schedule_add")


def delete_url(schedule_id: str) -> str:
    return reverse("admin:django_weft_schedule_delete", args=[schedule_id])


def backfill_url(schedule_id: str) -> str:
    return reverse("admin:django_weft_schedule_backfill", args=[schedule_id])


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def text_of(response: Any) -> str:
    """The page's text, tags removed and spaces folded."""
    html = re.sub(r"<(script|datalist|style)\b.*?</\1>", " ", response.content.decode(), flags=re.S)
    html = re.sub(r"</?(strong|em|code|span|a)\b[^>]*>", "", html)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def hourly(schedule_id: str = "hourly", **options: Any) -> Schedule:
    options.setdefault("every", "1h")
    client.create_schedule(schedule_id, options.pop("workflow", "tests.echo"), **options)
    return Schedule.objects.get(pk=schedule_id)


def declared() -> Schedule:
    runtime.sync_schedules()
    return Schedule.objects.get(pk=DECLARED)


def come_due(schedule_id: str) -> None:
    """Move the schedule's next fire half a second into the past (as if time passed)."""
    moment = (get_store().db_now() - timedelta(seconds=0.5)).replace(microsecond=0)
    Schedule.objects.filter(pk=schedule_id).update(next_fire_at=moment)


def entries(schedule_id: str) -> list[LogEntry]:
    return list(LogEntry.objects.filter(object_id=schedule_id).order_by("pk"))


class _Form(HTMLParser):
    """A form on the page (by id): its action URL and the fields a browser would send."""

    def __init__(self, form_id: str) -> None:
        super().__init__()
        self.form_id = form_id
        self.action: str | None = None
        self.fields: list[tuple[str, str]] = []
        self._inside = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "form" and found.get("id") == self.form_id:
            self._inside, self.action = True, found.get("action") or ""
        elif (
            tag == "input" and self._inside and found.get("type") in ("hidden", "text") and found.get("name")
        ):
            self.fields.append((str(found["name"]), found.get("value") or ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._inside = False


def confirmation_form(response: Any) -> _Form:
    assert response.status_code == 200, response
    assert "admin/django_weft/schedule/confirm_action.html" in [t.name for t in response.templates]
    form = _Form("weft-action-form")
    form.feed(response.content.decode())
    assert form.action is not None, "no confirmation form on the page"
    return form


def confirm(user: Client, form: _Form, **extra: str) -> Any:
    """Press "Yes" on a confirmation page (with ``extra`` fields filled in)."""
    fields = [(name, extra.pop(name, value)) for name, value in form.fields]
    fields += list(extra.items())
    return user.post(form.action or "", urlencode(fields), content_type="application/x-www-form-urlencoded")


def choose(user: Client, action: str, ids: list[str], query: str = "", **extra: str) -> Any:
    """Pick ``action`` on the changelist (``query`` its filters) with these rows ticked."""
    data: dict[str, Any] = {"action": action, "index": "0", "_selected_action": ids, **extra}
    return user.post(list_url(query), data)


def list_rows(response: Any) -> dict[str, str]:
    """The changelist's rows as text, by schedule id."""
    rows: dict[str, str] = {}
    for row in re.findall(r"<tr\b[^>]*>(.*?)</tr>", response.content.decode(), flags=re.S):
        found = re.search(r'name="_selected_action" value="([^"]+)"', row)
        if found:
            rows[found.group(1)] = " ".join(unescape(re.sub(r"<[^>]+>", " ", row)).split())
    return rows


def offered_actions(response: Any) -> set[str]:
    return set(re.findall(r'<option value="(\w+_schedules)"', response.content.decode()))


# -- the list -------------------------------------------------------------------------------------


def test_the_list_shows_spec_next_fire_last_outcome_counters_and_managed() -> None:
    root = logged_in("root", superuser=True)
    hourly("hourly", offset="5m")
    hourly("nightly", every=None, cron="0 2 * * *", timezone="Europe/Oslo", workflow="tests.echo")
    client.get_schedule_handle("hourly").trigger()
    client.create_schedule("paused-one", "tests.echo", every="1d", paused=True, note="month-end freeze")
    client.create_schedule(
        "ended", "tests.echo", every="1h", end_at=datetime(2020, 1, 1, tzinfo=UTC), start_at=None
    )
    declared()

    response = root.get(list_url())
    assert response.status_code == 200
    html = response.content.decode()
    rows = list_rows(response)
    assert list(rows) == ["ended", "hourly", "nightly", "paused-one", DECLARED]
    hourly_row = rows["hourly"]
    assert "tests.echo every 1h at +5m" in hourly_row
    run = WorkflowRun.objects.get(workflow_id__startswith="hourly-")
    scheduled = run.workflow_id.removeprefix("hourly-").replace("T", " ").removesuffix("Z")
    assert f"started {scheduled} {run.status}" in hourly_row
    assert f'href="{reverse("admin:django_weft_workflowrun_change", args=[run.pk])}"' in html
    assert f'title="run {run.workflow_id}"' in html
    assert f"weft-badge-{run.status}" in html  # the run's current status
    assert " 1 / 0 / 0" in hourly_row  # fired, skipped, missed
    assert "cron '0 2 * * *' in Europe/Oslo" in rows["nightly"]
    assert rows["paused-one"].startswith("paused-one tests.echo every 1d paused skip - 0 / 0 / 0")
    assert 'title="month-end freeze">paused<' in html
    assert rows["ended"].startswith("ended tests.echo every 1h ended skip")
    assert rows[DECLARED].endswith(" yes") and not rows["hourly"].endswith(" yes")  # declared in code


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ("paused__exact=1", {"b-paused"}),
        ("paused__exact=0", {"a-hourly", "c-long", DECLARED}),
        ("managed__exact=1", {DECLARED}),
        ("workflow=tests.m.wait_with_timeout", {"c-long"}),
        ("overlap__exact=buffer_one", {"c-long"}),
        ("q=hour", {"a-hourly"}),
        ("q=wait_with", {"c-long"}),
        ("q=nothing-like-it", set()),
    ],
)
def test_filters_and_search(query: str, shown: set[str]) -> None:
    root = logged_in("root", superuser=True)
    hourly("a-hourly")
    hourly("b-paused", paused=True)
    hourly("c-long", workflow=LONG, args=[3600], overlap="buffer_one")
    declared()
    response = root.get(list_url(query))
    assert response.status_code == 200
    assert set(list_rows(response)) == shown


@pytest.mark.parametrize(
    "query",
    [
        "q=a%00b",
        "workflow=%00",
        "overlap__exact=%00",
        "paused__exact=maybe",
        "managed__exact=%00",
        "o=99",
        "p=two",
        "p=1000000000000000000000",
        "e=1",
        "next_fire_at__gt=soon",
        "%00=1",
    ],
)
def test_odd_list_input_is_never_a_server_error(query: str) -> None:
    root = logged_in("root", superuser=True)
    hourly()
    response = root.get(list_url(query))
    assert response.status_code in (200, 302)
    if response.status_code == 302:
        assert root.get(response["Location"]).status_code == 200


@pytest.mark.parametrize("schedule_id", ["a%00b", "no-such", "a b", "x" * 300, "%ff"])
def test_odd_schedule_ids_in_the_address_are_not_found(schedule_id: str) -> None:
    root = logged_in("root", superuser=True)
    base = reverse("admin:django_weft_schedule_changelist")
    for tail in ("change/", "history/", "delete/", "backfill/"):
        response = root.get(f"{base}{schedule_id}/{tail}")
        assert response.status_code in (302, 404), (tail, response.status_code)


@pytest.mark.parametrize(
    "query",
    [
        "start_at=garbage",
        "end_at=2020-01-01",
        "paused=maybe",
        "args=[1",
        "overlap=zzz",
        "workflow=tests.nope",
        "id=%00",
        "catchup_window=%00",
        "next_fire_at=soon",
        "recent_actions=x",
        "cron=@daily&workflow=tests.echo",
    ],
)
def test_the_add_form_filled_from_the_address_is_never_a_server_error(query: str) -> None:
    root = logged_in("root", superuser=True)
    response = root.get(f"{add_url()}?{query}")
    assert response.status_code == 200
    if query.startswith("cron="):
        form = response.context["adminform"].form
        assert (form["cron"].value(), form["workflow"].value()) == ("@daily", "tests.echo")


# -- permissions ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("permissions", "offered"),
    [
        (VIEW, set()),
        (PAUSE, {"pause_schedules", "unpause_schedules"}),
        (("view_schedule", "trigger_schedule"), {"trigger_schedules"}),
        (("view_schedule", "delete_schedule"), {"delete_schedules"}),
        (
            ("view_schedule", "pause_schedule", "trigger_schedule", "delete_schedule"),
            set(ACTION_PERMISSIONS),
        ),
    ],
)
def test_actions_are_offered_only_with_their_permission(
    permissions: tuple[str, ...], offered: set[str]
) -> None:
    user = logged_in("operator", permissions=permissions)
    hourly()
    response = user.get(list_url())
    assert response.status_code == 200
    assert offered_actions(response) == offered
    assert "delete_selected" not in response.content.decode()  # replaced by delete_schedules
    page = user.get(change_url("hourly")).content.decode()
    assert ("weft-schedule-trigger" in page) == ("trigger_schedules" in offered)
    assert ("weft-schedule-pause" in page) == ("pause_schedules" in offered)
    assert ("weft-tool-backfill" in page) == ("trigger_schedules" in offered)


@pytest.mark.parametrize("action", sorted(ACTION_PERMISSIONS))
@pytest.mark.parametrize("confirmed", [False, True])
def test_a_forged_action_without_its_permission_is_refused(action: str, confirmed: bool) -> None:
    others = tuple(perm for name, perm in ACTION_PERMISSIONS.items() if perm != ACTION_PERMISSIONS[action])
    user = logged_in("operator", permissions=("view_schedule", "change_schedule", *others))
    schedule = hourly(paused=action == "unpause_schedules")
    extra = {"post": "yes"} if confirmed else {}
    assert choose(user, action, ["hourly"], **extra).status_code == 403
    all_matching = choose(user, action, [], _weft_all_matching="1", **extra)
    assert all_matching.status_code == 403
    after = Schedule.objects.get(pk="hourly")
    assert (after.paused, after.recent_actions, after.updated_at) == (
        schedule.paused,
        [],
        schedule.updated_at,
    )
    assert not WorkflowRun.objects.exists() and not LogEntry.objects.exists()


def test_pages_need_their_permission() -> None:
    hourly()
    anonymous = Client()
    assert anonymous.get(list_url()).status_code == 302  # to the login page
    assert logged_in("nobody").get(list_url()).status_code == 403
    viewer = logged_in("viewer", permissions=VIEW)
    page = viewer.get(change_url("hourly"))
    assert page.status_code == 200
    assert 'name="note"' not in page.content.decode() and 'name="cron"' not in page.content.decode()
    assert "every 1h" in text_of(page)
    assert viewer.get(add_url()).status_code == 403
    assert viewer.post(add_url(), {"id": "x", "workflow": "tests.echo", "every": "1h"}).status_code == 403
    assert viewer.post(change_url("hourly"), {"note": "mine"}).status_code == 403
    assert viewer.get(delete_url("hourly")).status_code == 403
    assert viewer.post(delete_url("hourly"), {"post": "yes"}).status_code == 403
    assert viewer.get(backfill_url("hourly")).status_code == 403
    assert viewer.post(backfill_url("hourly"), {}).status_code == 403
    assert logged_in("adder", permissions=("add_schedule",)).get(add_url()).status_code == 200
    changer = logged_in("changer", permissions=("change_schedule",))
    assert 'name="note"' in changer.get(change_url("hourly")).content.decode()
    assert logged_in("deleter", permissions=("delete_schedule",)).get(delete_url("hourly")).status_code == 200
    assert (
        logged_in("trigger", permissions=("trigger_schedule",)).get(backfill_url("hourly")).status_code == 200
    )
    assert Schedule.objects.get(pk="hourly").note == ""
    assert not Schedule.objects.filter(pk="x").exists()


# -- the actions ------------------------------------------------------------------------------------


def test_pause_asks_first_then_pauses_with_the_note_and_logs_each() -> None:
    user = logged_in("operator", permissions=PAUSE)
    hourly("first")
    hourly("second")
    hourly("already", paused=True, note="old note")

    response = choose(user, "pause_schedules", ["first", "second", "already"])
    form = confirmation_form(response)
    text = text_of(response)
    assert "Pause the 3 selected schedules?" in text
    assert "already tests.echo · paused (old note) will be skipped: already paused" in text
    assert not Schedule.objects.filter(pk__in=["first", "second"], paused=True).exists()

    done = confirm(user, form, note="release freeze")
    assert done.status_code == 302 and done["Location"] == list_url()
    assert messages_of(done) == ["Paused 2 schedules: first, second. Skipped 1: already paused: already."]
    for schedule_id in ("first", "second"):
        schedule = Schedule.objects.get(pk=schedule_id)
        assert schedule.paused and schedule.note == "release freeze"
        [entry] = entries(schedule_id)
        assert entry.action_flag == CHANGE and entry.change_message == "Paused (note: release freeze)"
        assert entry.user.username == "operator"
    assert Schedule.objects.get(pk="already").note == "old note"
    assert entries("already") == []


def test_a_note_too_long_shows_the_confirmation_again() -> None:
    user = logged_in("operator", permissions=PAUSE)
    hourly()
    form = confirmation_form(choose(user, "pause_schedules", ["hourly"]))
    again = confirm(user, form, note="x" * 2001)
    confirmation_form(again)
    assert "Ensure this value has at most 2000 characters" in text_of(again)
    assert not Schedule.objects.get(pk="hourly").paused


def test_unpause_skips_active_schedules_and_fires_from_the_next_time() -> None:
    user = logged_in("operator", permissions=PAUSE)
    hourly("paused-one", paused=True, note="holiday")
    hourly("active")
    form = confirmation_form(choose(user, "unpause_schedules", ["paused-one", "active"]))
    done = confirm(user, form)
    assert messages_of(done) == ["Unpaused 1 schedule: paused-one. Skipped 1: not paused: active."]
    schedule = Schedule.objects.get(pk="paused-one")
    assert not schedule.paused and schedule.note == "" and schedule.next_fire_at > get_store().db_now()
    assert [entry.change_message for entry in entries("paused-one")] == ["Unpaused"]


def test_trigger_starts_a_run_and_the_message_and_the_history_name_it() -> None:
    user = logged_in("operator", permissions=TRIGGER)
    hourly(paused=True)
    response = choose(user, "trigger_schedules", ["hourly"])
    form = confirmation_form(response)
    assert "Trigger the 1 selected schedule?" in text_of(response) and not WorkflowRun.objects.exists()
    done = confirm(user, form)
    run = WorkflowRun.objects.get(workflow_id__startswith="hourly-")
    assert run.search_attributes["weft_schedule_id"] == "hourly"
    assert messages_of(done) == [f"Triggered 1 schedule: hourly: started run {run.workflow_id}."]
    [entry] = entries("hourly")
    assert entry.change_message == f"Triggered: started run {run.workflow_id}"
    schedule = Schedule.objects.get(pk="hourly")
    assert schedule.paused and schedule.fired_count == 1
    assert schedule.recent_actions[0]["run_id"] == str(run.pk)


def test_trigger_with_an_open_run_skips_unless_the_overlap_is_overridden() -> None:
    user = logged_in("operator", permissions=TRIGGER)
    hourly(workflow=LONG, args=[3600])
    client.get_schedule_handle("hourly").trigger()
    first = WorkflowRun.objects.get()

    form = confirmation_form(choose(user, "trigger_schedules", ["hourly"]))
    skipped = confirm(user, form)
    [message] = messages_of(skipped)
    assert message == f"Triggered 1 schedule: hourly: skipped (run {first.pk} is still open)."
    assert next(iter(get_messages(skipped.wsgi_request))).level_tag == "warning"
    assert WorkflowRun.objects.count() == 1

    time.sleep(1.0)  # a trigger fires "now" to the second: in the same second it finds that run
    forced = confirm(
        user, confirmation_form(choose(user, "trigger_schedules", ["hourly"])), overlap="allow_all"
    )
    assert WorkflowRun.objects.count() == 2
    assert "started run hourly-" in messages_of(forced)[0]
    assert entries("hourly")[-1].change_message.startswith("Triggered with overlap allow_all: started run")
    bad = confirm(user, confirmation_form(choose(user, "trigger_schedules", ["hourly"])), overlap="sometimes")
    assert "Select a valid choice" in text_of(bad) and WorkflowRun.objects.count() == 2


def test_delete_goes_through_the_runtime_keeps_the_runs_and_skips_managed() -> None:
    user = logged_in("operator", permissions=("view_schedule", "delete_schedule"))
    hourly()
    client.get_schedule_handle("hourly").trigger()
    declared()
    response = choose(user, "delete_schedules", ["hourly", DECLARED])
    form = confirmation_form(response)
    assert "will be skipped: declared in code (workflow tests.scheduled_report)" in text_of(response)
    done = confirm(user, form)
    assert messages_of(done) == [
        "Deleted 1 schedule: hourly. Skipped 1: declared in code (workflow tests.scheduled_report): "
        f"{DECLARED}."
    ]
    assert list(Schedule.objects.values_list("pk", flat=True)) == [DECLARED]
    assert WorkflowRun.objects.filter(workflow_id__startswith="hourly-").count() == 1
    [entry] = entries("hourly")
    assert entry.action_flag == DELETION and entry.change_message == "Deleted"


def test_an_action_on_every_schedule_matching_the_filter_reaches_past_the_page() -> None:
    user = logged_in("operator", permissions=PAUSE)
    for index in range(120):
        hourly(f"many-{index:03}", workflow=LONG, args=[1])
    hourly("other")

    response = user.get(list_url("workflow=tests.m.wait_with_timeout"))
    assert len(re.findall(r'name="_selected_action"', response.content.decode())) == 100
    assert "apply to all 120 schedules matching the current filter" in text_of(response)

    chosen = choose(user, "pause_schedules", [], "workflow=tests.m.wait_with_timeout", _weft_all_matching="1")
    form = confirmation_form(chosen)
    assert "Pause all 120 schedules matching workflow: tests.m.wait_with_timeout?" in text_of(chosen)
    assert "and 20 more" in text_of(chosen)
    hourly("late", workflow=LONG, args=[1])  # made after the confirmation was shown: left alone
    done = confirm(user, form, note="maintenance")
    assert done.status_code == 302 and done["Location"] == list_url("workflow=tests.m.wait_with_timeout")
    assert messages_of(done)[0].startswith("Paused 120 schedules: many-000, many-001,")
    assert Schedule.objects.filter(paused=True, note="maintenance").count() == 120
    assert not Schedule.objects.get(pk="other").paused and not Schedule.objects.get(pk="late").paused
    assert LogEntry.objects.filter(action_flag=CHANGE).count() == 120


def test_apply_to_all_on_the_unfiltered_list_takes_every_schedule() -> None:
    user = logged_in("operator", permissions=PAUSE)
    hourly("one")
    hourly("two")
    chosen = choose(user, "pause_schedules", [], _weft_all_matching="1")
    assert "Pause all 2 schedules matching every schedule?" in text_of(chosen)
    confirm(user, confirmation_form(chosen))
    assert Schedule.objects.filter(paused=True).count() == 2


def test_the_buttons_on_a_schedules_page_come_back_to_it() -> None:
    user = logged_in("operator", permissions=(*PAUSE, "trigger_schedule"))
    hourly()
    page = change_url("hourly")
    response = user.post(
        list_url(), {"action": "pause_schedules", "_selected_action": "hourly", "_weft_return": page}
    )
    done = confirm(user, confirmation_form(response), note="look at it")
    assert done["Location"] == page
    assert "Unpause" in text_of(user.get(page)) and "look at it" in text_of(user.get(page))


def test_ticked_values_that_cannot_be_schedule_ids_change_nothing() -> None:
    user = logged_in("operator", permissions=PAUSE)
    hourly()
    response = choose(user, "pause_schedules", ["hourly", "a b", "x\x00"], post="yes")
    assert response.status_code == 302
    assert messages_of(response) == ["Not a schedule id: 'a b', 'x\\x00'; nothing was changed."]
    assert not Schedule.objects.get(pk="hourly").paused


def test_a_schedule_deleted_before_the_confirmation_is_reported() -> None:
    user = logged_in("operator", permissions=PAUSE)
    hourly("kept")
    hourly("gone")
    form = confirmation_form(choose(user, "pause_schedules", ["kept", "gone"]))
    runtime.delete_schedule("gone")
    done = confirm(user, form)
    assert messages_of(done) == ["Paused 1 schedule: kept. Skipped 1: no such schedule: gone."]


# -- the add and change form ------------------------------------------------------------------------

ADD = {
    "id": "invoices-eu",
    "workflow": "tests.echo",
    "args": '["eu"]',
    "kwargs": '{"express": true}',
    "search_attributes": '{"team": "billing"}',
    "cron": "30 6 * * mon-fri",
    "every": "",
    "offset": "",
    "timezone": "Europe/Berlin",
    "start_at_0": "",
    "start_at_1": "",
    "end_at_0": "",
    "end_at_1": "",
    "jitter": "30s",
    "overlap": "buffer_one",
    "catchup_window": "10m",
    "note": "made by hand",
}


def test_add_creates_the_schedule_through_the_runtime_and_logs_it() -> None:
    user = logged_in("adder", permissions=("add_schedule", "view_schedule"))
    response = user.post(add_url(), {**ADD, "paused": "on"})
    assert response.status_code == 302, text_of(response)
    schedule = Schedule.objects.get(pk="invoices-eu")
    assert (schedule.workflow_name, schedule.args, schedule.kwargs) == (
        "tests.echo",
        ["eu"],
        {"express": True},
    )
    assert (schedule.cron, schedule.timezone, schedule.jitter_seconds) == (
        "30 6 * * mon-fri",
        "Europe/Berlin",
        30,
    )
    assert (schedule.overlap, schedule.catchup_window_seconds, schedule.note) == (
        "buffer_one",
        600,
        "made by hand",
    )
    assert schedule.search_attributes == {"team": "billing"} and schedule.paused
    assert schedule.next_fire_at is not None and not schedule.managed
    [entry] = entries("invoices-eu")
    assert entry.action_flag == ADDITION


def test_add_with_an_interval_and_bounds_in_the_operators_time_zone() -> None:
    user = logged_in("root", superuser=True)
    with override_settings(TIME_ZONE="Europe/Oslo"):
        response = user.post(
            add_url(),
            {
                **ADD,
                "cron": "",
                "every": "15m",
                "offset": "2m",
                "start_at_0": "2030-06-01",
                "start_at_1": "09:00:00",
                "end_at_0": "2030-06-30",
                "end_at_1": "18:00:00",
            },
        )
    assert response.status_code == 302, text_of(response)
    schedule = Schedule.objects.get(pk="invoices-eu")
    assert (schedule.every_seconds, schedule.offset_seconds, schedule.cron) == (900, 120, "")
    assert schedule.start_at == datetime(2030, 6, 1, 7, 0, tzinfo=UTC)  # 09:00 summer time in Oslo
    assert schedule.end_at == datetime(2030, 6, 30, 16, 0, tzinfo=UTC)
    assert schedule.next_fire_at == datetime(2030, 6, 1, 7, 2, tzinfo=UTC)


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"cron": "61 * * * *"}, "cron", "Invalid cron expression"),
        ({"cron": "* * *"}, "cron", "has 3 field(s)"),
        ({"cron": "0 0 30 2 *"}, "cron", "never matches a date"),
        ({"cron": "", "every": ""}, "cron", "Give exactly one of cron="),
        ({"every": "1h"}, "cron", "Give exactly one of cron="),
        ({"cron": "", "every": "0.5s"}, "every", "Every must be at least 1 second"),
        ({"cron": "", "every": "soon"}, "every", "Every 'soon' is not a duration"),
        ({"offset": "5m"}, "offset", "Offset= applies to every= intervals"),
        ({"cron": "", "every": "1h", "offset": "2h"}, "offset", "must be shorter than the interval"),
        ({"timezone": "Mars/Olympus"}, "timezone", "Unknown time zone 'Mars/Olympus'"),
        ({"timezone": ""}, "timezone", "This field is required"),
        (
            {
                "start_at_0": "2030-02-01",
                "start_at_1": "00:00",
                "end_at_0": "2030-01-01",
                "end_at_1": "00:00",
            },
            "end_at",
            "is before start_at",
        ),
        ({"start_at_0": "2030-13-01", "start_at_1": "00:00"}, "start_at", "Enter a valid date"),
        ({"jitter": "-1s"}, "jitter", "Jitter '-1s' is not a duration"),
        ({"overlap": "sometimes"}, "overlap", "Select a valid choice"),
        ({"catchup_window": "forever"}, "catchup_window", "is not a duration"),
        ({"id": "bad id"}, "id", "A schedule id is letters, digits"),
        ({"id": ""}, "id", "This field is required"),
        ({"id": "x" * 201}, "id", "at most 200 characters"),
        ({"id": "a\x00b"}, "id", "Null characters are not allowed"),
        ({"workflow": "tests.nope"}, "workflow", "Select a valid choice"),
        ({"workflow": "tests.countdown"}, "args", "cannot be started with args=['eu']"),
        ({"args": "[1, 2"}, "args", "This is not valid JSON"),
        ({"args": '{"a": 1}'}, "args", "Give a JSON list"),
        ({"kwargs": "[]"}, "kwargs", "Give a JSON object"),
        ({"search_attributes": '{"weft_schedule_id": "x"}'}, "search_attributes", "are set by the schedule"),
        ({"note": "a\x00b"}, "note", "Null characters are not allowed"),
        ({"cron": "0 9 * * *\x00"}, "cron", "Null characters are not allowed"),
    ],
)
def test_bad_input_is_an_error_on_its_field_and_writes_nothing(
    changes: dict[str, str], field: str, message: str
) -> None:
    user = logged_in("root", superuser=True)
    response = user.post(add_url(), {**ADD, **changes})
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert field in errors, errors
    assert message in " ".join(errors[field]), errors
    assert not Schedule.objects.exists() and not LogEntry.objects.exists()


def test_a_time_that_does_not_exist_in_the_operators_zone_is_an_error() -> None:
    user = logged_in("root", superuser=True)
    with override_settings(TIME_ZONE="Europe/Oslo"):  # clocks go from 02:00 to 03:00 that day
        response = user.post(add_url(), {**ADD, "start_at_0": "2030-03-31", "start_at_1": "02:30"})
    assert "be interpreted in time zone Europe/Oslo" in " ".join(
        response.context["adminform"].form.errors["start_at"]
    )
    assert not Schedule.objects.exists()


def test_a_taken_id_is_an_error_on_the_id() -> None:
    user = logged_in("root", superuser=True)
    hourly("invoices-eu", note="the first")
    response = user.post(add_url(), ADD)
    assert "exists already" in " ".join(response.context["adminform"].form.errors["id"])
    assert Schedule.objects.get().note == "the first"


def test_change_goes_through_the_runtime_from_the_next_fire_on() -> None:
    user = logged_in("changer", permissions=("view_schedule", "change_schedule"))
    user.post(add_url(), ADD)  # refused: no add permission
    hourly("invoices-eu", every=None, cron="30 6 * * mon-fri", timezone="Europe/Berlin", args=["eu"])
    before = Schedule.objects.get()
    page = user.get(change_url("invoices-eu"))
    form = page.context["adminform"].form
    assert form.initial["cron"] == "30 6 * * mon-fri" and form.initial["catchup_window"] == "1m"

    data = {
        **ADD,
        "cron": "",
        "every": "2h",
        "offset": "5m",
        "timezone": "Europe/Berlin",
        "note": "now hourly",
    }
    data.pop("id")
    response = user.post(change_url("invoices-eu"), data)
    assert response.status_code == 302, text_of(response)
    after = Schedule.objects.get()
    assert (after.cron, after.every_seconds, after.offset_seconds) == ("", 7200, 300)
    assert after.next_fire_at != before.next_fire_at and after.next_fire_at.minute == 5
    assert (after.note, after.overlap, after.kwargs) == ("now hourly", "buffer_one", {"express": True})
    [entry] = entries("invoices-eu")
    assert entry.action_flag == CHANGE and "Cron" in entry.get_change_message()


def test_a_change_that_the_runtime_refuses_writes_nothing() -> None:
    user = logged_in("root", superuser=True)
    hourly("invoices-eu", args=["eu"])
    before = Schedule.objects.get()
    data = {**ADD, "cron": "", "every": "1h", "workflow": "tests.countdown"}
    response = user.post(change_url("invoices-eu"), data)
    assert response.status_code == 200
    assert "args" in response.context["adminform"].form.errors
    after = Schedule.objects.get()
    assert (after.workflow_name, after.updated_at, after.note) == ("tests.echo", before.updated_at, "")
    assert not LogEntry.objects.exists()


def test_saving_an_unchanged_form_writes_nothing() -> None:
    user = logged_in("root", superuser=True)
    hourly("plain", offset="5m", jitter="1m30s")
    before = Schedule.objects.get()
    form = user.get(change_url("plain")).context["adminform"].form
    data = {name: form[name].value() for name in form.fields if name not in ("start_at", "end_at")}
    data = {key: "" if value is None else value for key, value in data.items()}
    data.update({"start_at_0": "", "start_at_1": "", "end_at_0": "", "end_at_1": ""})
    assert data["jitter"] == "1m30s" and data["offset"] == "5m"
    response = user.post(change_url("plain"), data)
    assert response.status_code == 302, text_of(response)
    assert Schedule.objects.get().updated_at == before.updated_at


def test_a_schedule_declared_in_code_is_read_only_but_for_its_note() -> None:
    user = logged_in("root", superuser=True)
    schedule = declared()
    page = user.get(change_url(DECLARED))
    text = text_of(page)
    assert (
        "Declared in code (workflow tests.scheduled_report); change it there and run "
        "manage.py weft_schedules sync" in text
    )
    html = page.content.decode()
    assert 'name="note"' in html and 'name="cron"' not in html and 'name="workflow"' not in html
    assert "cron '0 2 * * *' in Europe/Oslo" in text
    assert delete_url(DECLARED) not in html  # no Delete link

    response = user.post(change_url(DECLARED), {**ADD, "note": "owned by the data team"})
    assert response.status_code == 302, text_of(response)
    after = Schedule.objects.get(pk=DECLARED)
    assert after.note == "owned by the data team"
    assert (after.cron, after.timezone, after.args, after.overlap) == (
        schedule.cron,
        schedule.timezone,
        schedule.args,
        schedule.overlap,
    )

    refused = user.get(delete_url(DECLARED))
    assert refused.status_code == 302 and refused["Location"] == change_url(DECLARED)
    message = messages_of(refused)[-1]
    assert "is declared in code (workflow tests.scheduled_report)" in message and "--prune" in message
    assert user.post(delete_url(DECLARED), {"post": "yes"}).status_code == 302
    assert Schedule.objects.filter(pk=DECLARED).exists()


def test_the_delete_page_deletes_through_the_runtime() -> None:
    user = logged_in("root", superuser=True)
    hourly()
    client.get_schedule_handle("hourly").trigger()
    assert user.get(delete_url("hourly")).status_code == 200
    done = user.post(delete_url("hourly"), {"post": "yes"})
    assert done.status_code == 302
    assert not Schedule.objects.exists() and WorkflowRun.objects.count() == 1
    assert [entry.action_flag for entry in entries("hourly")] == [DELETION]


# -- a schedule's page --------------------------------------------------------------------------------


def test_the_page_shows_the_next_ten_fires_in_the_operators_zone_and_utc() -> None:
    user = logged_in("root", superuser=True)
    client.create_schedule("nightly", "tests.echo", cron="0 2 * * *", timezone="America/New_York")
    with override_settings(TIME_ZONE="Europe/Oslo"):
        page = user.get(change_url("nightly"))
    html = page.content.decode()
    table = re.search(r'<table class="weft-next-fires">(.*?)</table>', html, flags=re.S)
    assert table is not None
    assert "your time (Europe/Oslo)" in table.group(
        1
    ) and "the schedule&#x27;s (America/New_York)" in table.group(1)
    rows = re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td></tr>", table.group(1))
    assert len(rows) == 10
    fires = Schedule.objects.get().next_fire_at
    assert rows[0][1] == f"{fires:%Y-%m-%d %H:%M:%S} UTC"
    assert all(row[2].endswith(("02:00:00 EST", "02:00:00 EDT")) for row in rows)
    assert all(row[0].split()[-1] in ("CET", "CEST") for row in rows)


def test_the_page_shows_recent_actions_with_their_runs_and_links_to_the_runs() -> None:
    user = logged_in("root", superuser=True)
    hourly(workflow=LONG, args=[3600], overlap="buffer_one")
    come_due("hourly")
    fire_due_schedules(10)
    run = WorkflowRun.objects.get()
    come_due("hourly")
    fire_due_schedules(10)  # buffered behind the open run
    page = user.get(change_url("hourly"))
    text = text_of(page)
    html = page.content.decode()
    assert "Recent actions (the latest 2, newest first)" in text
    assert "buffered schedule" in text and f"starts when run {run.pk} finishes" in text
    assert "started schedule" in text and run.workflow_id in text
    assert reverse("admin:django_weft_workflowrun_change", args=[run.pk]) in html
    assert "fired 1 · skipped 0 · missed 0" in text
    schedule = Schedule.objects.get()
    assert f"{schedule.buffered[0][:10]}" in text  # the buffered fire is listed
    runs = re.search(r'href="([^"]+)" class="weft-schedule-runs"', html)
    assert runs is not None
    listed = user.get(unescape(runs.group(1)))
    assert listed.status_code == 200 and run.workflow_id in text_of(listed)

    assert "weft-badge-completed" not in html
    client.get_handle(run.workflow_id).signal("go", 1)
    drive(run.pk)  # the run finishes: its status on the page follows
    assert "weft-badge-completed" in user.get(change_url("hourly")).content.decode()


# -- Backfill -------------------------------------------------------------------------------------


def backfill(user: Client, schedule_id: str, start: str, end: str, overlap: str = "allow_all") -> Any:
    day0, time0 = start.split(" ")
    day1, time1 = end.split(" ")
    return user.post(
        backfill_url(schedule_id),
        {"start_0": day0, "start_1": time0, "end_0": day1, "end_1": time1, "overlap": overlap},
    )


def test_backfill_fires_each_time_of_the_range_once_and_twice_is_a_no_op() -> None:
    user = logged_in("operator", permissions=("view_schedule", "trigger_schedule", "view_workflowrun"))
    client.create_schedule("daily", "tests.echo", cron="0 9 * * *", timezone="UTC")
    page = user.get(backfill_url("daily"))
    assert page.status_code == 200 and "Times are in your time zone (UTC)" in text_of(page)

    first = backfill(user, "daily", "2027-01-01 00:00", "2027-01-03 23:59")
    assert first.status_code == 200
    text = text_of(first)
    assert "3 scheduled times from 2027-01-01 00:00:00 UTC to 2027-01-03 23:59:00 UTC: 3 started." in text
    assert sorted(WorkflowRun.objects.values_list("workflow_id", flat=True)) == [
        f"daily-2027-01-0{day}T09:00:00Z" for day in (1, 2, 3)
    ]
    again = backfill(user, "daily", "2027-01-01 00:00", "2027-01-03 23:59")
    assert "3 already started." in text_of(again)
    assert WorkflowRun.objects.count() == 3
    range_words = "3 scheduled times from 2027-01-01 00:00:00 UTC to 2027-01-03 23:59:00 UTC"
    assert [entry.change_message for entry in entries("daily")] == [
        f"Backfilled: {range_words}: 3 started.",
        f"Backfilled: {range_words}: 3 already started.",
    ]
    empty = backfill(user, "daily", "2027-01-01 10:00", "2027-01-01 11:00")
    assert "No scheduled time falls between" in text_of(empty) and WorkflowRun.objects.count() == 3


@pytest.mark.parametrize(
    ("start", "end", "field", "message"),
    [
        ("2027-01-03 00:00", "2027-01-01 00:00", "end", "is before its start"),
        ("2027-01-01 00:00", "2027-01-21 20:00", "end", "holds more than 500 scheduled times"),
        ("0001-01-01 00:00", "9999-12-31 18:00", "end", "holds more than 500 scheduled times"),
        ("2027-02-30 00:00", "2027-03-01 00:00", "start", "Enter a valid date"),
        ("2027-01-01 25:00", "2027-03-01 00:00", "start", "Enter a valid time"),
        ("9999-12-31 20:00", "9999-12-31 21:00", "start", "out of range"),  # UTC-5: year 10000 in UTC
    ],
)
def test_a_bad_backfill_range_is_an_error_on_the_form(start: str, end: str, field: str, message: str) -> None:
    user = logged_in("root", superuser=True)
    client.create_schedule("often", "tests.echo", every="1h")
    with override_settings(TIME_ZONE="America/New_York"):
        response = backfill(user, "often", start, end)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert message in " ".join(errors.get(field, [])), errors
    assert not WorkflowRun.objects.exists() and not LogEntry.objects.exists()


def test_a_backfill_of_the_most_times_it_takes() -> None:
    user = logged_in("root", superuser=True)
    client.create_schedule("often", "tests.echo", every="1h")
    response = backfill(user, "often", "2027-01-01 00:00", "2027-01-21 19:00")  # 500 hours
    assert "500 scheduled times" in text_of(response) and "500 started" in text_of(response)
    assert WorkflowRun.objects.count() == 500


def test_backfill_times_are_read_in_the_operators_time_zone() -> None:
    user = logged_in("root", superuser=True)
    client.create_schedule("hourly", "tests.echo", every="1h")
    with override_settings(TIME_ZONE="Europe/Oslo"):
        response = backfill(
            user, "hourly", "2027-03-28 01:30", "2027-03-28 03:30"
        )  # clocks go forward at 02:00
    assert response.status_code == 200
    # 01:30 CET is 00:30 UTC and 03:30 CEST is 01:30 UTC: one fire, at 01:00 UTC.
    assert list(WorkflowRun.objects.values_list("workflow_id", flat=True)) == ["hourly-2027-03-28T01:00:00Z"]
    with override_settings(TIME_ZONE="Europe/Oslo"):
        gap = backfill(
            user, "hourly", "2027-03-28 02:30", "2027-03-28 04:00"
        )  # 02:30 does not exist that day
    assert "start" in gap.context["adminform"].form.errors


# -- the runs dashboard ---------------------------------------------------------------------------


@pytest.fixture
def unregister() -> Iterator[Callable[[str], None]]:
    """Remove a workflow from the registry for one test (as if its code were deleted)."""
    removed: dict[str, Any] = {}

    def remove(name: str) -> None:
        removed[name] = registry.workflows.pop(name)

    yield remove
    registry.workflows.update(removed)


def test_a_refused_fire_shows_as_an_error_and_the_dashboard_counts_it(
    unregister: Callable[[str], None],
) -> None:
    hourly("broken", workflow="tests.countdown", args=[1])
    unregister("tests.countdown")
    client.get_schedule_handle("broken").trigger()
    hourly("fine")
    hourly("resting", paused=True)

    root = logged_in("root", superuser=True)
    rows = list_rows(root.get(list_url("last_outcome=error")))
    assert list(rows) == ["broken"]
    assert "error" in rows["broken"] and "WorkflowNotRegistered" in rows["broken"]

    dashboard = root.get(reverse("admin:django_weft_workflowrun_dashboard"))
    section = re.search(
        r'<section class="module weft-dash-schedules".*?</section>', dashboard.content.decode(), flags=re.S
    )
    assert section is not None
    words = " ".join(unescape(re.sub(r"<[^>]+>", " ", section.group(0))).split())
    assert "3 schedules the next fire at" in words and "1 paused" in words and "1 last fire refused" in words
    assert "0 due, no live worker can fire" in words and "data-stranded-schedules" not in section.group(0)
    assert f'href="{list_url("paused__exact=1")}"' in section.group(0)
    assert f'href="{list_url("last_outcome=error")}"' in section.group(0)

    runs_only = logged_in("runs-only", permissions=("view_workflowrun",))
    page = runs_only.get(reverse("admin:django_weft_workflowrun_dashboard")).content.decode()
    assert "weft-dash-schedules" not in page


def test_the_dashboard_lists_due_schedules_no_live_worker_can_fire(db: None) -> None:
    now = datetime.now(UTC)
    hourly("a")
    hourly("b", workflow="tests.countdown", args=[1])
    hourly("c", workflow="tests.countdown", args=[1])
    hourly("d-later", workflow="tests.countdown", args=[1])
    hourly("later")
    Schedule.objects.filter(pk="a").update(next_fire_at=now - timedelta(minutes=5))
    Schedule.objects.filter(pk__in=["b", "c"]).update(next_fire_at=now - timedelta(hours=2))

    root = logged_in("root", superuser=True)
    page = root.get(reverse("admin:django_weft_workflowrun_dashboard"))
    section = re.search(
        r'<section class="module weft-dash-schedules".*?</section>', page.content.decode(), re.S
    )
    assert section is not None
    html = section.group(0)
    tile = re.search(
        r'<a class="weft-tile weft-tile-alert" href="#weft-stranded-schedules".*?</a>', html, re.S
    )
    assert tile is not None and '<span class="weft-tile-count">3</span>' in tile.group(0)
    rows = dict(re.findall(r'<tr data-stranded-schedules="([^"]+)">(.*?)</tr>', html, re.S))
    assert list(rows) == ["tests.countdown", "tests.echo"]
    due_link = list_url("workflow=tests.countdown&due=now")
    assert f'<a href="{due_link.replace("&", "&amp;")}">2</a>' in rows["tests.countdown"]
    assert "<td>2 h 0 min</td>" in rows["tests.countdown"] and "<td>5 min" in rows["tests.echo"]
    assert set(list_rows(root.get(due_link))) == {"b", "c"}  # not its schedule due later
    assert set(list_rows(root.get(list_url("due=now")))) == {"a", "b", "c"}
