"""Flow control in Chromium: the dashboard's busiest concurrency keys, a count that leads
to the runs queued for that key, and a queued run's page saying why it waits."""

from __future__ import annotations

from django_weft import client
from django_weft.runtime.process import get_engine

from .conftest import Browser, make_user


def test_from_the_busiest_keys_to_the_queued_runs_and_why_they_wait(browser: Browser) -> None:
    make_user("viewer", permissions=("view_workflowrun",))
    engine = get_engine()
    holder = client.start("tests.flow.per_key", args=["customer-7"], id="holds-customer-7")
    assert str(engine.run_turn(holder.run_id)) == "parked"
    queued = [client.start("tests.flow.per_key", args=["customer-7"], id=f"queued-{i}") for i in range(3)]
    for handle in queued:
        assert str(engine.run_turn(handle.run_id)) == "not_claimed"
    for tenant in ("acme", "globex"):
        handle = client.start("tests.flow.fair", args=[tenant], id=f"report-{tenant}")
        engine.run_turn(handle.run_id)

    browser.login("viewer")
    browser.go("/admin/django_weft/workflowrun/dashboard/")
    row = browser.find('#weft-concurrency tr[data-concurrency="tests.flow.per_key customer-7"]')
    assert row.text.split()[:6] == ["tests.flow.per_key", "customer-7", "1", "/", "1", "3"]
    browser.screenshot("dashboard-concurrency")

    row.find_element("css selector", "td:nth-child(4) a").click()
    browser.find("#result_list")
    rows = browser.all("#result_list tbody tr")
    assert sorted(r.text.split()[2] for r in rows) == ["queued-0", "queued-1", "queued-2"]
    assert all("queued: concurrency key customer-7 (1 of 1 in use)" in r.text for r in rows)

    browser.go("/admin/django_weft/workflowrun/")
    browser.find("#result_list")
    link = next(a for a in browser.all("#result_list tbody a") if a.text == "queued-0")
    link.click()
    facts = browser.find(".weft-facts").text
    assert "key customer-7, queued for a slot, 1 of 1 in use" in facts
    assert "queued: concurrency key customer-7 (1 of 1 in use)" in facts
