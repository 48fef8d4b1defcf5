"""``WEFT_READ_DATABASE`` in the admin: the pages that only show rows (the run and schedule
changelists, a run's page, a schedule's page to a user who may not change it, the
dashboard) read the read database; an action, a tool and a form that may be saved read
and write the primary. The ``"replica"`` alias mirrors the default test database, so the
queries each connection ran say which database a page read."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings
from django.urls import reverse

from django_weft import client, runtime
from django_weft.models import Signal, WorkflowRun
from tests.support.databases import BOTH, REPLICA, weft_queries
from tests.support.driver import park

from .conftest import change_url, changelist_url, logged_in, make_run

pytestmark = pytest.mark.django_db(transaction=True, databases=BOTH)

dashboard_url = reverse("admin:django_weft_workflowrun_dashboard")
schedules_url = reverse("admin:django_weft_schedule_changelist")


def schedule_url(schedule_id: str) -> str:
    return reverse("admin:django_weft_schedule_change", args=[schedule_id])


@pytest.fixture
def root() -> Client:
    return logged_in("root", superuser=True)


@pytest.fixture
def family() -> WorkflowRun:
    """A waiting run with history, a signal, a timer, a parent and a child, holding a
    concurrency slot: every part of a run's page has something to read."""
    parent = make_run("family-parent", status="completed")
    handle = client.start("tests.m.sleep_with_handlers", args=[3600], id="family-run")
    park(handle.run_id)
    handle.signal("note", "a")
    WorkflowRun.objects.filter(pk=handle.run_id).update(parent=parent)
    make_run("family-child", parent=WorkflowRun.objects.get(pk=handle.run_id))
    return WorkflowRun.objects.get(pk=handle.run_id)


def test_the_changelist_reads_the_read_database_only(root: Client, family: WorkflowRun) -> None:
    with override_settings(WEFT_READ_DATABASE=REPLICA), weft_queries() as queries:
        page = root.get(changelist_url())
        filtered = root.get(f"{changelist_url()}?overdue=timer&status__exact=waiting")
    assert page.status_code == filtered.status_code == 200
    assert "family-run" in page.content.decode()
    assert queries[REPLICA] and queries["default"] == []


def test_a_runs_page_reads_the_run_and_all_it_shows_from_the_read_database(
    root: Client, family: WorkflowRun
) -> None:
    flow = client.start("tests.flow.per_key", args=["c-1"]).run_id
    park(flow)
    holder_url = change_url(WorkflowRun.objects.get(pk=flow))
    with override_settings(WEFT_READ_DATABASE=REPLICA), weft_queries() as queries:
        page = root.get(change_url(family))
        slot_page = root.get(holder_url)
    assert page.status_code == slot_page.status_code == 200
    html = page.content.decode()
    assert "family-parent" in html and "family-child" in html and "note" in html
    assert "1 of 1 in use" in slot_page.content.decode()
    replica = "\n".join(queries[REPLICA])
    for table in ("workflowrun", "step", "signal", "update", "timer"):
        assert f"django_weft_{table}" in replica
    assert queries["default"] == []


def test_the_dashboard_reads_the_read_database_only(root: Client, family: WorkflowRun) -> None:
    client.create_schedule("nightly", "tests.echo", cron="@daily")
    with override_settings(WEFT_READ_DATABASE=REPLICA), weft_queries() as queries:
        page = root.get(dashboard_url)
    assert page.status_code == 200
    assert queries[REPLICA] and queries["default"] == []


def test_the_schedule_list_and_a_read_only_schedule_page_read_the_read_database(root: Client) -> None:
    client.create_schedule("nightly", "tests.echo", cron="@daily")
    viewer = logged_in("viewer", permissions=("view_schedule",))
    with override_settings(WEFT_READ_DATABASE=REPLICA), weft_queries() as shown:
        assert root.get(schedules_url).status_code == 200
        assert viewer.get(schedule_url("nightly")).status_code == 200
    assert shown[REPLICA] and shown["default"] == []
    # A user who may change the schedule gets a form to save: it is read from the primary.
    with override_settings(WEFT_READ_DATABASE=REPLICA), weft_queries() as form:
        assert root.get(schedule_url("nightly")).status_code == 200
    assert form["default"] and form[REPLICA] == []


def test_an_action_reads_and_changes_the_primary_and_the_list_after_it_reads_the_replica(
    root: Client, family: WorkflowRun
) -> None:
    data = {"action": "cancel_runs", "index": "0", "_selected_action": [str(family.pk)]}
    with override_settings(WEFT_READ_DATABASE=REPLICA), weft_queries() as action:
        confirmation = root.post(changelist_url(), data)
        done = root.post(changelist_url(), {**data, "post": "yes", "mode": "terminate", "reason": "r"})
    assert confirmation.status_code == 200 and done.status_code == 302
    assert WorkflowRun.objects.get(pk=family.pk).status == "cancelled"
    assert action["default"] and action[REPLICA] == []

    with override_settings(WEFT_READ_DATABASE=REPLICA), weft_queries() as after:
        assert root.get(done["Location"]).status_code == 200
    assert after[REPLICA] and after["default"] == []


def test_a_tool_reads_and_writes_the_primary(root: Client, family: WorkflowRun) -> None:
    url = reverse("admin:django_weft_workflowrun_signal", args=[family.pk])
    with override_settings(WEFT_READ_DATABASE=REPLICA), weft_queries() as tool:
        assert root.get(url).status_code == 200
        sent = root.post(url, {"name": "note", "payload": '"b"'})
    assert sent.status_code == 302
    assert Signal.objects.filter(run=family, payload="b").exists()
    assert tool["default"] and tool[REPLICA] == []


def test_without_the_setting_no_page_reads_another_database(root: Client, family: WorkflowRun) -> None:
    client.create_schedule("nightly", "tests.echo", cron="@daily")
    with weft_queries() as queries:
        for url in (
            changelist_url(),
            change_url(family),
            dashboard_url,
            schedules_url,
            schedule_url("nightly"),
        ):
            assert root.get(url).status_code == 200, url
    assert queries["default"] and queries[REPLICA] == []
    assert runtime.run_queryset(may_lag=True).db == "default"
