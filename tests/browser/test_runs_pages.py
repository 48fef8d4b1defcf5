"""The run changelist and detail page in Chromium: badges, filters, search, the timeline."""

from __future__ import annotations

from typing import Any

from django_weft import client
from django_weft.models import Step, WorkflowRun
from tests.support.waiting import wait_until

from .conftest import Browser, make_user


def test_changelist_badges_filter_search_and_timeline(browser: Browser, driver: Any) -> None:
    make_user("root", superuser=True)
    done = [client.start("tests.ten_steps", args=[f"b{i}"], id=f"browser-ten-{i}") for i in range(3)]
    waiting = client.start("tests.m.wait_with_timeout", args=[3600], id="browser-waiting")
    for handle in done:
        handle.result(timeout=30)
    wait_until(lambda: WorkflowRun.objects.get(pk=waiting.run_id).status == "waiting", "the run waits")

    browser.login("root")
    browser.go("/admin/django_weft/workflowrun/")
    badges = browser.all("#result_list .weft-badge")
    assert len(badges) == 4
    assert {badge.text.lower() for badge in badges} == {"completed", "waiting"}
    browser.screenshot("changelist")

    browser.go("/admin/django_weft/workflowrun/?status__exact=waiting")
    rows = browser.all("#result_list tbody tr")
    assert len(rows) == 1 and "browser-waiting" in rows[0].text

    browser.go("/admin/django_weft/workflowrun/")
    box = browser.find("#searchbar")
    box.send_keys("browser-ten-1\n")
    browser.find("#result_list")
    rows = browser.all("#result_list tbody tr")
    assert len(rows) == 1 and "browser-ten-1" in rows[0].text

    run = WorkflowRun.objects.get(workflow_id="browser-ten-1")
    browser.go(f"/admin/django_weft/workflowrun/{run.pk}/change/")
    browser.find("svg.weft-timeline")
    seqs = sorted(int(el.get_attribute("data-seq")) for el in browser.all("svg.weft-timeline [data-seq]"))
    assert seqs == sorted(Step.objects.filter(run=run).values_list("seq", flat=True))
    assert len(seqs) >= 10
    browser.screenshot("run-detail")
