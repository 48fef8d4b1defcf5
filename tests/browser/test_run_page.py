"""The run page in Chromium, built around its timeline: a retried activity's failed
attempts with their errors, the timeline in the first screen, every time with its zone,
the query form offering the workflow's queries, a live run's page following the run to its
end without a reload, the object a run was started for. And the schedules list fits a
1,366 pixel wide screen. Makes the screenshot ``run-page``."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from django_weft import client, runtime
from django_weft.models import WorkflowRun
from tests.support.waiting import wait_until
from tests.testapp.models import LedgerEntry

from .conftest import Browser, make_user

RUNS = "/admin/django_weft/workflowrun/"
LAPTOP = (1366, 768)


@pytest.fixture
def oslo(settings: Any) -> None:
    """The operator's time zone is not UTC, so a time without its zone would be ambiguous."""
    settings.TIME_ZONE = "Europe/Oslo"


def _laptop(browser: Browser) -> None:
    browser.web.set_window_size(*LAPTOP)


@pytest.mark.urls("tests.admin.related_urls")  # the entry's admin page is on a site of its own
def test_a_retried_activity_shows_every_failed_attempt_and_the_timeline_comes_first(
    browser: Browser, driver: Any, oslo: None
) -> None:
    make_user("root", superuser=True)
    entry = LedgerEntry.objects.create(key="order-1042", amount=12)
    # tests.flaky fails its first two attempts (ConnectionError "attempt N failed").
    handle = client.start(
        "tests.flaky",
        args=["order-1042", 2],
        id="order-1042-payment",
        search_attributes={"customer": 7},
        related_object=entry,
    )
    assert handle.result(timeout=30) == 3

    browser.login("root")
    _laptop(browser)
    browser.go(f"{RUNS}{handle.run_id}/change/")
    timeline = browser.find("#weft-timeline")
    # The timeline starts within the first screen of a 1,366 x 768 laptop.
    top = browser.web.execute_script("return arguments[0].getBoundingClientRect().top", timeline)
    assert 0 < top < browser.web.execute_script("return window.innerHeight") - 100, top

    # The first attempt's error is on the page, and the second's, each with its traceback folded.
    failed = browser.all("#weft-steps .weft-failed-attempt")
    assert [row.get_attribute("data-attempt") for row in failed] == ["1", "2"]
    assert "ConnectionError: attempt 1 failed" in failed[0].text
    assert "ConnectionError: attempt 2 failed" in failed[1].text
    trace = failed[0].find_element("css selector", "details.weft-trace")
    assert trace.get_attribute("open") is None
    trace.find_element("css selector", "summary").click()
    assert "Traceback (most recent call last)" in trace.find_element("css selector", "pre").text
    trace.find_element("css selector", "summary").click()  # folded again for the screenshot
    assert "2 failed attempts retried" in timeline.text

    # Every time shows its zone, the viewer's; UTC on hover.
    created = browser.find(".weft-fact-created time")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d CES?T", created.text), created.text
    assert created.get_attribute("title").endswith(" UTC")
    started = browser.find("#weft-steps .weft-step-row time")
    assert started.text.endswith(("CET", "CEST"))
    assert "Times in Europe/Oslo" in browser.find("#weft-run-header").text

    # Empty sections are not shown; a section with something to show is.
    assert browser.all("#weft-family") == [] and browser.all("#weft-signals") == []
    assert browser.all("#weft-search-attributes")

    # The order the run is for, as a link to its admin page.
    link = browser.find(".weft-fact-for a.weft-related-object")
    assert link.get_attribute("href").endswith(f"/related-admin/testapp/ledgerentry/{entry.pk}/change/")
    browser.screenshot("run-page", width=LAPTOP[0])


def test_the_query_form_offers_the_workflows_queries_with_their_arguments(
    browser: Browser, driver: Any
) -> None:
    make_user("root", superuser=True)
    handle = client.start("tests.m.cart", args=["c1"], id="cart-1")
    wait_until(lambda: WorkflowRun.objects.get(pk=handle.run_id).status == "waiting", "the cart waits")

    browser.login("root")
    browser.go(f"{RUNS}{handle.run_id}/query/")
    options = [o.get_attribute("value") for o in browser.all("datalist#weft-known-names option")]
    assert options == ["state", "count"]
    assert browser.find("#id_name").get_attribute("list") == "weft-known-names"
    assert (
        "state(), count(plus=0)"
        in browser.find(".field-name .help, .field-name .helptext, #id_name_helptext").text
    )

    browser.go(f"{RUNS}{handle.run_id}/update/")
    options = [o.get_attribute("value") for o in browser.all("datalist#weft-known-names option")]
    assert sorted(options) == ["address", "broken", "close", "nap"]


def test_a_live_runs_page_shows_its_end_without_a_reload(browser: Browser, driver: Any) -> None:
    make_user("root", superuser=True)
    handle = client.start("tests.m.wait_with_timeout", args=[3600], id="waits-for-go")
    wait_until(lambda: WorkflowRun.objects.get(pk=handle.run_id).status == "waiting", "the run waits")

    browser.login("root")
    browser.go(f"{RUNS}{handle.run_id}/change/")
    assert browser.find("#weft-run").get_attribute("data-live") == "1"
    assert browser.find("#weft-refresh").is_selected()
    browser.web.execute_script("window.weftNotReloaded = true")
    runtime.signal(handle.run_id, "go", "now")
    assert handle.result(timeout=30) == "got now"

    def shows_completed() -> bool:
        # Read in one script: the refresh may swap the content between two WebDriver calls.
        shown = browser.web.execute_script(
            "const badge = document.querySelector('#weft-run-header .weft-badge');"
            "return badge ? badge.textContent : null"
        )
        return (shown or "").lower() == "completed"

    wait_until(shows_completed, "the page shows the run completed", timeout=20)
    assert browser.web.execute_script("return window.weftNotReloaded") is True
    assert browser.find("#weft-run").get_attribute("data-live") == "0"
    assert browser.all("#weft-refresh") == []


def test_the_refresh_can_be_turned_off(browser: Browser, driver: Any) -> None:
    make_user("root", superuser=True)
    handle = client.start("tests.m.wait_with_timeout", args=[3600], id="stays-put")
    wait_until(lambda: WorkflowRun.objects.get(pk=handle.run_id).status == "waiting", "the run waits")

    browser.login("root")
    browser.go(f"{RUNS}{handle.run_id}/change/")
    browser.find("#weft-refresh").click()
    assert not browser.find("#weft-refresh").is_selected()
    runtime.signal(handle.run_id, "go", "now")
    handle.result(timeout=30)
    # Two refresh periods (5 s each for a waiting run) pass: the page still shows it waiting.
    time.sleep(11)
    assert browser.find("#weft-run-header .weft-badge").text.lower() == "waiting"
    browser.go(f"{RUNS}{handle.run_id}/change/")  # the choice is kept, and a reload shows the end
    assert browser.find("#weft-run-header .weft-badge").text.lower() == "completed"


def test_the_schedules_list_fits_a_laptop_screen(browser: Browser, oslo: None) -> None:
    make_user("root", superuser=True)
    client.create_schedule("nightly-invoices-for-the-eu-customers", "tests.echo", args=["eu"],
                           cron="30 6 * * mon-fri", timezone="Europe/Berlin", overlap="buffer_one",
                           catchup_window="10m")  # fmt: skip
    client.create_schedule("cart-reminders", "tests.echo", every="15m", offset="2m", paused=True,
                           note="paused during the migration")  # fmt: skip
    hourly = client.create_schedule("hourly-report", "tests.echo", every="1h")
    runtime.sync_schedules()
    hourly.trigger()  # a last outcome with its run's link

    browser.login("root")
    _laptop(browser)
    browser.go("/admin/django_weft/schedule/")
    browser.find("#result_list")
    # Neither the page nor the table's own frame (Django's admin scrolls a wide table
    # inside it) scrolls sideways.
    overflow = browser.web.execute_script(
        "const page = document.documentElement, frame = document.querySelector('#changelist .results');"
        "return Math.max(page.scrollWidth - page.clientWidth, frame.scrollWidth - frame.clientWidth)"
    )
    assert overflow <= 0, f"the list is {overflow} px wider than the window"
