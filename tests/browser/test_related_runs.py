"""``related_runs`` in Chromium: a test model's admin page lists the runs of the object,
newest first with status badges, and its links lead to a run and to all of them."""

from __future__ import annotations

from typing import Any

import pytest

from django_weft import client
from django_weft.models import WorkflowRun
from tests.support.waiting import wait_until
from tests.testapp.models import LedgerEntry

from .conftest import Browser, make_user

pytestmark = pytest.mark.urls("tests.admin.related_urls")


def test_an_objects_page_lists_its_runs(browser: Browser, driver: Any) -> None:
    make_user("root", superuser=True)
    entry = LedgerEntry.objects.create(key="k7", amount=12)
    tags = {"ledger_id": entry.pk}
    # Four runs of the entry's workflow id, one after the other (one live run per id).
    for attempt in range(4):
        handle = client.start(
            "tests.ten_steps",
            args=[f"ledger-{attempt}"],
            id="ledger-k7",
            on_conflict="start_new_if_terminal",
            search_attributes=tags,
        )
        handle.result(timeout=30)
    live = client.start(
        "tests.m.wait_with_timeout",
        args=[3600],
        id="ledger-k7",
        on_conflict="start_new_if_terminal",
        search_attributes=tags,
    )
    wait_until(lambda: WorkflowRun.objects.get(pk=live.run_id).status == "waiting", "the live run waits")
    client.start("tests.ten_steps", args=["other"], id="ledger-k70", search_attributes={"ledger_id": 0})

    browser.login("root")
    browser.go(f"/related-admin/testapp/ledgerentry/{entry.pk}/change/")
    by_id = browser.find(".field-runs_by_id table.weft-related-runs")
    rows = by_id.find_elements("css selector", "tbody tr")
    assert len(rows) == 3  # the field's limit
    assert rows[0].get_attribute("data-run") == live.run_id
    assert "waiting" in rows[0].text.lower() and "ledger-k7" in rows[0].text
    assert all("completed" in row.text.lower() for row in rows[1:])
    assert "all 5 runs" in browser.find(".field-runs_by_id .weft-related-more").text
    browser.screenshot("related-runs")

    browser.find(".field-runs_by_attribute .weft-related-more a").click()
    browser.find("#result_list")
    assert "q=ledger_id" in browser.web.current_url
    assert len(browser.all("#result_list tbody tr")) == 5

    browser.go(f"/related-admin/testapp/ledgerentry/{entry.pk}/change/")
    browser.find(f'.field-runs_by_id tr[data-run="{live.run_id}"] a').click()
    browser.find("#weft-timeline")
    assert live.run_id in browser.web.current_url
