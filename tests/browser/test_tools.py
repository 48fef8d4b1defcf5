"""The object tools in Chromium: a signal sent from a run's page completes the run, a
validator's rejection shows on the update form, a query's result shows on its page, and
Start workflow starts a run. Each leaves a screenshot."""

from __future__ import annotations

from typing import Any

from django_weft import client
from django_weft.models import WorkflowRun
from tests.support.waiting import wait_until

from .conftest import Browser, make_user


def _status(run_id: str) -> str:
    return WorkflowRun.objects.get(pk=run_id).status


def _type(browser: Browser, selector: str, text: str) -> None:
    box = browser.find(selector)
    box.clear()
    box.send_keys(text)


def _waiting(workflow: str, *args: Any, id: str) -> str:
    handle = client.start(workflow, args=list(args), id=id)
    wait_until(lambda: _status(handle.run_id) == "waiting", "the run waits")
    return handle.run_id


def test_send_signal_moves_a_waiting_run_forward(browser: Browser, driver: Any) -> None:
    make_user("root", superuser=True)
    run_id = _waiting("tests.m.wait_with_timeout", 3600, id="browser-signal")

    browser.login("root")
    browser.go(f"/admin/django_weft/workflowrun/{run_id}/change/")
    browser.find("a.weft-tool-signal").click()
    _type(browser, "#id_name", "go")
    _type(browser, "#id_payload", '{"approved_by": "ann"}')
    browser.screenshot("send-signal")
    browser.find("#weft-signal-form input[type=submit]").click()

    browser.find("ul.messagelist")
    assert "Signal go sent" in browser.find("ul.messagelist").text
    wait_until(lambda: _status(run_id) == "completed", "the run completes")
    assert WorkflowRun.objects.get(pk=run_id).result == "got {'approved_by': 'ann'}"


def test_send_update_shows_the_validators_error(browser: Browser, driver: Any) -> None:
    make_user("root", superuser=True)
    run_id = _waiting("tests.m.cart", "browser-cart", id="browser-update")

    browser.login("root")
    browser.go(f"/admin/django_weft/workflowrun/{run_id}/change/")
    browser.find("a.weft-tool-update").click()
    _type(browser, "#id_name", "address")
    _type(browser, "#id_payload", '{"street": "Main Street 1"}')
    browser.find("#weft-update-form input[type=submit]").click()

    error = browser.find(".field-payload ul.errorlist")
    assert "city is required" in error.text
    assert "Please correct the error below." in browser.find("p.errornote").text
    browser.screenshot("send-update-error")


def test_run_query_shows_the_result(browser: Browser, driver: Any) -> None:
    make_user("root", superuser=True)
    run_id = _waiting("tests.m.cart", "browser-query", id="browser-query")
    client.get_handle(run_id).signal("add", {"sku": "A-1"})
    wait_until(lambda: client.get_handle(run_id).query("count") == 1, "the query counts one")

    browser.login("root")
    browser.go(f"/admin/django_weft/workflowrun/{run_id}/change/")
    browser.find("a.weft-tool-query").click()
    _type(browser, "#id_name", "state")
    browser.find("#weft-query-form input[type=submit]").click()

    outcome = browser.find("#weft-outcome")
    assert "Query state answered" in outcome.text
    assert '"sku": "A-1"' in outcome.find_element("css selector", "pre").text
    browser.screenshot("run-query")


def test_start_workflow_starts_a_run(browser: Browser, driver: Any) -> None:
    from selenium.webdriver.support.ui import Select

    make_user("root", superuser=True)
    browser.login("root")
    browser.go("/admin/django_weft/workflowrun/")
    browser.find("a.weft-tool-start").click()
    Select(browser.find("#id_workflow")).select_by_value("tests.m.wait_with_timeout")
    _type(browser, "#id_args", "[3600]")
    _type(browser, "#id_workflow_id", "browser-started")
    _type(browser, "#id_search_attributes", '{"customer": 7}')
    browser.screenshot("start-workflow")
    browser.find("#weft-start-form input[type=submit]").click()

    assert "Started tests.m.wait_with_timeout browser-started" in browser.find("ul.messagelist").text
    run = WorkflowRun.objects.get(workflow_id="browser-started")
    assert browser.web.current_url.endswith(f"/admin/django_weft/workflowrun/{run.pk}/change/")
    assert run.search_attributes == {"customer": 7}
    wait_until(lambda: _status(str(run.pk)) == "waiting", "the run waits")  # the worker took it: a real run
