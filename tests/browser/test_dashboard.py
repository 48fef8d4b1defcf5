"""The runs dashboard in Chromium: reached from the app index, its sparkline drawn, and a
number that leads to the changelist filtered to the runs it counts."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_weft import WorkflowFailed, client
from django_weft.models import WorkflowRun
from tests.support.waiting import wait_until

from .conftest import Browser, make_user


def test_dashboard_from_the_app_index_to_a_filtered_changelist(browser: Browser, driver: Any) -> None:
    make_user("viewer", permissions=("view_workflowrun",))
    done = [client.start("tests.ten_steps", args=[f"d{i}"], id=f"dash-ten-{i}") for i in range(8)]
    failing = client.start("tests.always_fails", args=["dash"], id="dash-failing")
    waiting = [
        client.start("tests.m.wait_with_timeout", args=[3600], id=f"dash-waiting-{i}") for i in range(2)
    ]
    cart = client.start("tests.m.cart", args=["dash"], id="dash-cart")
    for handle in done:
        handle.result(timeout=30)
    with pytest.raises(WorkflowFailed):
        failing.result(timeout=30)
    wait_until(
        lambda: (
            WorkflowRun.objects.filter(
                pk__in=[handle.run_id for handle in [*waiting, cart]], status="waiting"
            ).count()
            == 3
        ),
        "the three runs wait",
    )
    # The runs all finished this minute; move their clocks back over the hour so the
    # sparkline has a shape (finished_at and updated_at together, as the store writes them).
    now = timezone.now()
    for minutes_ago, handle in zip((52, 41, 41, 30, 18, 18, 18, 7), done, strict=True):
        moment = now - timedelta(minutes=minutes_ago)
        WorkflowRun.objects.filter(pk=handle.run_id).update(finished_at=moment, updated_at=moment)

    browser.login("viewer")
    browser.go("/admin/django_weft/")
    browser.find("#weft-dashboard-link").click()
    browser.find("svg.weft-sparkline")
    slots = browser.all("svg.weft-sparkline .weft-spark-slot")
    assert len(slots) == 60
    assert sum(int(slot.get_attribute("data-count")) for slot in slots) == 9
    assert max(int(slot.get_attribute("data-count")) for slot in slots) == 3
    assert browser.find('[data-figure="finished"] .weft-tile-count').text == "9"
    assert browser.find('[data-figure="status-waiting"] .weft-tile-count').text == "3"
    assert browser.find('#weft-workflows tr[data-workflow="tests.ten_steps"] td').text == "8"
    browser.screenshot("dashboard")

    browser.find('[data-figure="status-failed"]').click()
    browser.find("#result_list")
    assert "status__exact=failed" in browser.web.current_url
    rows = browser.all("#result_list tbody tr")
    assert len(rows) == 1 and "dash-failing" in rows[0].text

    browser.go("/admin/django_weft/workflowrun/")
    browser.find(".weft-dashboard-tool").click()
    browser.find('[data-figure="finished"]').click()
    browser.find("#result_list")
    assert "finished=1h" in browser.web.current_url
    assert len(browser.all("#result_list tbody tr")) == 9
