"""The lifecycle actions in Chromium: cancel with its confirmation, "apply to all runs
matching the filter" across pages, the buttons on a run's page, and what view-only staff
see (nothing to act with) and get (403) when they forge the POST."""

from __future__ import annotations

from typing import Any

from django_weft import client
from django_weft.models import WorkflowRun
from tests.support.driver import park
from tests.support.waiting import wait_until

from .conftest import Browser, make_user

WAITS = "tests.m.wait_with_timeout"
CHANGELIST = "/admin/django_weft/workflowrun/"


def _status(run_id: str) -> str:
    return WorkflowRun.objects.get(pk=run_id).status


def _choose_action(browser: Browser, name: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(browser.find("select[name=action]")).select_by_value(name)
    browser.find("button[name=index]").click()


def test_cancel_with_its_confirmation_cancels_a_waiting_run(browser: Browser, driver: Any) -> None:
    make_user("root", superuser=True)
    doomed = client.start(WAITS, args=[3600], id="browser-doomed")
    kept = client.start(WAITS, args=[3600], id="browser-kept")
    wait_until(lambda: {_status(doomed.run_id), _status(kept.run_id)} == {"waiting"}, "both runs wait")

    browser.login("root")
    browser.go(CHANGELIST)
    browser.find(f'input.action-select[value="{doomed.run_id}"]').click()
    _choose_action(browser, "cancel_runs")

    browser.find("#weft-action-form")
    assert "the 1 selected run?" in browser.find("#content-main").text
    assert [item.text.split()[0] for item in browser.all("li.weft-action-run")] == ["browser-doomed"]
    browser.find("#id_reason").send_keys("tried in the browser")
    browser.screenshot("action-confirm")
    browser.find("#weft-action-form input[type=submit]").click()

    assert browser.find(".messagelist").text == "Cancelled 1 run."
    run = WorkflowRun.objects.get(pk=doomed.run_id)
    assert run.status == "cancelled" and run.error["reason"] == "tried in the browser"
    assert _status(kept.run_id) == "waiting"

    # The run page's buttons go through the same confirmation and come back to the run.
    browser.go(f"{CHANGELIST}{kept.run_id}/change/")
    labels = [button.text.lower() for button in browser.all("form.weft-lifecycle button")]
    assert labels == ["cancel", "suspend"]
    browser.screenshot("run-lifecycle-buttons")
    browser.find("form.weft-lifecycle button.weft-lifecycle-suspend").click()
    browser.find("#weft-action-form input[type=submit]").click()
    assert browser.find(".messagelist").text == "Suspended 1 run."
    assert browser.web.current_url.endswith(f"/{kept.run_id}/change/")
    assert _status(kept.run_id) == "suspended"
    labels = [button.text.lower() for button in browser.all("form.weft-lifecycle button")]
    assert labels == ["cancel", "resume"]


def test_all_runs_matching_the_filter_are_cancelled_across_pages(browser: Browser) -> None:
    make_user("root", superuser=True)
    run_ids = []
    for i in range(250):
        handle = client.start(WAITS, args=[3600], id=f"browser-bulk-{i:03}")
        park(handle.run_id)
        run_ids.append(handle.run_id)
    other = client.start("tests.sleepy", args=[3600], id="browser-other")
    park(other.run_id)

    browser.login("root")
    browser.go(f"{CHANGELIST}?status__exact=waiting&workflow={WAITS}")
    assert len(browser.all("#result_list tbody tr")) == 50
    assert browser.find("p.paginator").text.split() == ["1", "2", "3", "4", "5", "250", "workflow", "runs"]
    browser.find('input[name="_weft_all_matching"]').click()
    browser.screenshot("changelist-all-matching")
    _choose_action(browser, "cancel_runs")

    browser.find("#weft-action-form")
    question = browser.find(".weft-confirm-question").text
    assert question == f"Cancel all 250 runs matching status: waiting; workflow: {WAITS}?"
    assert len(browser.all("li.weft-action-run")) == 100
    assert browser.find("li.weft-action-more").text == "and 150 more"
    browser.screenshot("all-matching-confirm")
    browser.find("#weft-action-form input[type=submit]").click()

    assert browser.find(".messagelist").text == "Cancelled 250 runs."
    assert WorkflowRun.objects.filter(pk__in=run_ids, status="cancelled").count() == 250
    assert _status(other.run_id) == "waiting"
    # Back on the filtered list, which is now empty.
    assert "status__exact=waiting" in browser.web.current_url
    assert browser.all("#result_list tbody tr") == []


def test_view_only_staff_get_no_actions_and_a_forged_post_is_refused(browser: Browser) -> None:
    make_user("viewer", permissions=("view_workflowrun",))
    handle = client.start(WAITS, args=[3600], id="browser-viewed")
    park(handle.run_id)

    browser.login("viewer")
    browser.go(f"{CHANGELIST}?status__exact=waiting")
    assert len(browser.all("#result_list tbody tr")) == 1
    assert browser.all("input.action-select") == [] and browser.all("#action-toggle") == []
    assert browser.all("select[name=action]") == [] and browser.all('input[name="_weft_all_matching"]') == []
    browser.go(f"{CHANGELIST}{handle.run_id}/change/")
    browser.find("#weft-timeline")
    assert browser.all("form.weft-lifecycle") == []

    statuses = browser.web.execute_async_script(
        """
        const [runId, done] = arguments;
        const token = document.cookie.split("; ").find((c) => c.startsWith("csrftoken=")).split("=")[1];
        const post = (query, fields) => fetch("/admin/django_weft/workflowrun/" + query, {
            method: "POST", credentials: "same-origin", redirect: "manual",
            headers: {"X-CSRFToken": token},
            body: new URLSearchParams(fields),
        }).then((response) => response.status);
        Promise.all([
            post("", {action: "cancel_runs", index: "0", _selected_action: runId}),
            post("", {action: "cancel_runs", _selected_action: runId, post: "yes"}),
            post("?status__exact=waiting", {action: "suspend_runs", _weft_all_matching: "1", post: "yes"}),
        ]).then(done);
        """,
        handle.run_id,
    )
    assert statuses == [403, 403, 403]
    assert _status(handle.run_id) == "waiting"
