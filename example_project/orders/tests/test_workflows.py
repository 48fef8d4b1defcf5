"""The orders app's workflows, tested with the ``weft`` fixture: each test lives through
minutes, days or weeks of the workflow on a virtual clock, in seconds of wall
time, in the test's own database transaction."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command

from django_weft import client
from django_weft.models import WorkflowRun
from example_project.orders.models import Order
from example_project.orders.workflows import (
    charge_subscription,
    fulfil,
    nightly_report,
    subscription_trial,
)

DAY = timedelta(days=1)


@contextmanager
def in_seconds_not_days() -> Iterator[None]:
    """The wall time of the block: these tests skip days, they do not wait them (a few
    seconds at most, even on a loaded machine)."""
    began = time.monotonic()
    yield
    elapsed = time.monotonic() - began
    assert elapsed < 5.0, f"the block took {elapsed:.2f} s of wall time"


# -- the subscription trial: 30 days, then a week to add a card ------------------------------


def test_a_trial_whose_customer_adds_a_card_becomes_a_paid_subscription(weft) -> None:
    began = weft.now()
    with in_seconds_not_days():
        run = weft.start(subscription_trial, "Ada", id="trial-ada")
        weft.advance("30d")
        assert run.status() == "waiting"  # reminded; waiting for a payment method
        weft.advance("6d")
        weft.signal(run, "payment_method_added", {"card": "visa-4242"})
    result = run.result()
    assert result["outcome"] == "subscribed"
    assert result["at"] == (began + 36 * DAY).isoformat()
    order = Order.objects.get(pk=result["order"])
    assert (order.customer, order.status, order.receipt) == ("Ada", "paid", result["receipt"])
    reminders = [entry for entry in weft.history(run) if entry["name"] == "orders.send_trial_ending"]
    assert [entry["status"] for entry in reminders] == ["completed"]


def test_a_trial_without_a_card_lapses_after_the_weeks_grace(weft) -> None:
    began = weft.now()
    with in_seconds_not_days():
        run = weft.start(subscription_trial, "Grace", id="trial-grace")
        weft.advance("36d 23h")
        assert run.status() == "waiting"
        weft.advance("1h")
    assert run.result() == {"customer": "Grace", "outcome": "lapsed", "at": (began + 37 * DAY).isoformat()}
    assert not Order.objects.exists()


def test_a_card_the_provider_declines_is_charged_again_an_hour_later(weft) -> None:
    attempts: list[datetime] = []

    def provider(customer: str, card: str) -> str:
        attempts.append(weft.now())
        if len(attempts) == 1:
            raise ConnectionError("the card provider did not answer")
        return "rcpt-test"

    weft.mock_activity(charge_subscription, side_effect=provider)
    with in_seconds_not_days():
        run = weft.start(subscription_trial, "Bo", id="trial-bo")
        weft.advance("30d")
        weft.signal(run, "payment_method_added", {"card": "visa-1881"})
        assert run.status() == "waiting"  # for the retry
        weft.advance("59m")
        assert len(attempts) == 1
        weft.advance("1m")
    assert run.result()["receipt"] == "rcpt-test"
    assert attempts[1] - attempts[0] == timedelta(hours=1)
    charge = next(e for e in weft.history(run) if e["name"] == "orders.charge_subscription")
    assert (charge["status"], charge["attempt"]) == ("completed", 2)


# -- order fulfilment ---------------------------------------------------------------------------


def test_an_order_with_a_warehouse_slot_is_paid_shipped_and_confirmed(weft) -> None:
    order = Order.objects.create(customer="Ada Lovelace", amount="42.00")
    with in_seconds_not_days():
        run = weft.start(fulfil, order.pk, id=order.workflow_id)
        assert weft.query(run, "progress")["stage"] == "waiting for a warehouse slot"
        assert weft.update(run, "add_gift_note", "Happy birthday")["gift_note"] == "Happy birthday"
        weft.signal(run, "warehouse_slot", "dock 3")
    result = run.result()
    assert (result["warehouse_slot"], result["gift_note"]) == ("dock 3", "Happy birthday")
    assert result["confirmation"].startswith("msg-")  # the queued email ran in the test
    order.refresh_from_db()
    assert (order.status, order.receipt) == ("fulfilled", result["receipt"])
    charge = next(e for e in weft.history(run) if e["name"] == "orders.charge_card")
    assert charge["attempt"] == 2  # the simulated gateway timeout, retried


def test_an_order_nobody_gives_a_slot_waits_a_day_then_ships_from_the_first_free_one(weft) -> None:
    """A person trying the demo has a day to send the signal, not minutes."""
    order = Order.objects.create(customer="Ada Lovelace", amount="42.00")
    with in_seconds_not_days():
        run = weft.start(fulfil, order.pk, id=order.workflow_id)
        weft.advance("23h 59m")
        assert run.status() == "waiting"
        weft.advance("1m")
    assert run.result()["warehouse_slot"] == "first free slot"
    order.refresh_from_db()
    assert order.status == "fulfilled"


def test_an_order_that_must_ship_within_two_minutes_times_out_waiting_for_a_slot(weft) -> None:
    order = Order.objects.create(customer="Grace Hopper", amount="7.00")
    with in_seconds_not_days():
        run = client.start(fulfil, args=[order.pk], id=order.workflow_id, execution_timeout="2m")
        weft.run_until_idle()
        assert run.status() == "waiting"
        weft.advance("2m")
    assert run.status() == "timed_out"
    order.refresh_from_db()
    assert order.status == "paid"  # charged, never shipped


# -- the nightly report: a schedule declared in code ---------------------------------------------


@pytest.mark.parametrize("weft_start_time", [datetime(2030, 6, 10, 12, 0, tzinfo=UTC)])
def test_the_nightly_report_runs_at_two_in_oslo_on_each_of_the_next_three_nights(weft) -> None:
    call_command("weft_schedules", "sync", stdout=StringIO())
    schedule = client.get_schedule_handle("nightly-orders-report")
    # 02:00 in Oslo is midnight UTC in June (summer time).
    nights = [datetime(2030, 6, day, 0, 0, tzinfo=UTC) for day in (11, 12, 13)]
    assert schedule.describe(next_count=3).next_fire_times == nights
    with in_seconds_not_days():
        weft.advance("3d")
    runs = WorkflowRun.objects.filter(workflow_name=nightly_report.name).order_by("created_at")
    assert [run.status for run in runs] == ["completed"] * 3
    assert [datetime.fromisoformat(run.result["scheduled_at"]) for run in runs] == nights
