"""The schedules' admin in Chromium: a schedule made with the add form, triggered from the
list through its confirmation, its run linked from the schedule's recent actions; pausing
from a schedule's page with a note. Makes the screenshots ``schedules-list`` and
``schedule-detail``."""

from __future__ import annotations

from typing import Any

import pytest
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from django_weft import client, runtime
from django_weft.models import Schedule, WorkflowRun
from tests.support.waiting import wait_until

from .conftest import Browser, make_user

SCHEDULES = "/admin/django_weft/schedule/"


def _choose_action(browser: Browser, name: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(browser.find("select[name=action]")).select_by_value(name)
    browser.find("button[name=index]").click()


@pytest.fixture
def oslo(settings: Any) -> None:
    """The operator's time zone: Europe/Oslo (the pages show UTC beside it)."""
    settings.TIME_ZONE = "Europe/Oslo"


def test_a_schedule_made_in_the_add_form_triggered_from_the_list_links_its_run(
    browser: Browser, driver: Any, oslo: None
) -> None:
    from selenium.webdriver.support.ui import Select

    make_user("root", superuser=True)
    # Neighbours for the list: one in another zone, one paused, one declared in code.
    client.create_schedule("nightly-invoices", "tests.echo", args=["eu"], cron="30 6 * * mon-fri",
                           timezone="Europe/Berlin", overlap="buffer_one", catchup_window="10m")  # fmt: skip
    client.create_schedule("cart-reminders", "tests.echo", every="15m", offset="2m", paused=True,
                           note="paused during the migration")  # fmt: skip
    runtime.sync_schedules()

    browser.login("root")
    browser.go(f"{SCHEDULES}add/")
    browser.find("#id_id").send_keys("hourly-report")
    Select(browser.find("#id_workflow")).select_by_value("tests.echo")
    browser.find("#id_args").send_keys('["hourly"]')
    browser.find("#id_every").send_keys("1h")
    browser.find("#id_offset").send_keys("5m")
    browser.find("#id_note").send_keys("made in the browser")
    browser.find("input[name=_save]").click()

    assert "was added successfully" in browser.find(".messagelist").text
    schedule = Schedule.objects.get(pk="hourly-report")
    assert (schedule.every_seconds, schedule.offset_seconds, schedule.args) == (3600, 300, ["hourly"])

    browser.find('input.action-select[value="hourly-report"]').click()
    _choose_action(browser, "trigger_schedules")
    browser.find("#weft-action-form")
    assert "Trigger the 1 selected schedule?" in browser.find(".weft-confirm-question").text
    assert [item.text.split()[0] for item in browser.all("li.weft-action-schedule")] == ["hourly-report"]
    browser.find("#weft-action-form input[type=submit]").click()

    message = browser.find(".messagelist").text
    run = WorkflowRun.objects.get(workflow_id__startswith="hourly-report-")
    assert message == f"Triggered 1 schedule: hourly-report: started run {run.workflow_id}."
    wait_until(lambda: WorkflowRun.objects.get(pk=run.pk).status == "completed", "the run completes")
    browser.go(SCHEDULES)
    rows = {
        row.find_element("css selector", "th").text: row.text for row in browser.all("#result_list tbody tr")
    }
    assert list(rows) == ["cart-reminders", "hourly-report", "nightly-invoices", "tests-nightly-report"]
    assert "started" in rows["hourly-report"] and "completed" in rows["hourly-report"]
    assert "paused" in rows["cart-reminders"]
    browser.find("#toggle-nav-sidebar").click()  # the list's columns need the width
    browser.screenshot("schedules-list", width=1440)

    browser.find('a[href$="/hourly-report/change/"]').click()
    browser.find("#weft-recent-actions")
    assert len(browser.all("table.weft-next-fires tbody tr")) == 10
    headers = [cell.get_attribute("textContent") for cell in browser.all("table.weft-next-fires thead th")]
    assert headers == ["your time (Europe/Oslo)", "UTC"]
    [row] = browser.all("#weft-recent-actions tbody tr")
    assert "started" in row.text and "trigger" in row.text and "completed" in row.text
    browser.screenshot("schedule-detail")
    row.find_element("css selector", "a.weft-schedule-run").click()
    browser.find("#weft-timeline")
    assert browser.web.current_url.endswith(f"/workflowrun/{run.pk}/change/")


def test_pausing_from_a_schedules_page_with_a_note(browser: Browser) -> None:
    make_user("operator", permissions=("view_schedule", "pause_schedule"))
    client.create_schedule("nightly", "tests.echo", cron="0 2 * * *", timezone="Europe/Oslo")

    browser.login("operator")
    browser.go(f"{SCHEDULES}nightly/change/")
    assert [button.text.lower() for button in browser.all("form.weft-lifecycle button")] == ["pause"]
    assert browser.all(".weft-tool-backfill") == []  # backfilling needs trigger_schedule
    browser.find("button.weft-schedule-pause").click()

    browser.find("#weft-action-form")
    browser.find("#id_note").send_keys("holiday freeze")
    browser.screenshot("schedule-pause-confirm")
    browser.find("#weft-action-form input[type=submit]").click()

    assert browser.find(".messagelist").text == "Paused 1 schedule: nightly."
    assert browser.web.current_url.endswith("/nightly/change/")
    assert "paused (holiday freeze)" in browser.find(".field-state").text
    assert [button.text.lower() for button in browser.all("form.weft-lifecycle button")] == ["unpause"]
    schedule = Schedule.objects.get(pk="nightly")
    assert schedule.paused and schedule.note == "holiday freeze"


def test_backfilling_a_range_twice_starts_its_runs_once(browser: Browser) -> None:
    make_user("operator", permissions=("view_schedule", "trigger_schedule", "view_workflowrun"))
    client.create_schedule("daily-report", "tests.echo", cron="0 9 * * *", timezone="UTC")

    browser.login("operator")
    browser.go(f"{SCHEDULES}daily-report/change/")
    browser.find("a.weft-tool-backfill").click()
    for name, value in (
        ("start_0", "2027-01-01"),
        ("start_1", "00:00"),
        ("end_0", "2027-01-05"),
        ("end_1", "00:00"),
    ):
        field = browser.find(f"input[name={name}]")
        field.clear()
        field.send_keys(value)
    browser.find("#weft-backfill-form input[type=submit]").click()

    summary = browser.find("#weft-outcome p").text
    assert summary == "4 scheduled times from 2027-01-01 00:00:00 UTC to 2027-01-05 00:00:00 UTC: 4 started."
    assert len(browser.all("table.weft-backfill-fires tbody tr")) == 4
    browser.screenshot("schedule-backfill")
    first = browser.find("#weft-outcome p")
    browser.find("#weft-backfill-form input[type=submit]").click()  # the form keeps the range
    # The same selector matches on the page being left: wait for the new page's outcome.
    WebDriverWait(browser.web, 10).until(expected_conditions.staleness_of(first))
    assert browser.find("#weft-outcome p").text.endswith(": 4 already started.")
    assert WorkflowRun.objects.filter(workflow_id__startswith="daily-report-2027-01-0").count() == 4
