"""The ``orders.fulfil`` workflow. Autodiscovered: django_weft imports every installed
app's ``workflows`` module at startup, as the admin does with ``admin.py``."""

from __future__ import annotations

import hashlib
import logging
from decimal import Decimal
from typing import Any

from django_weft import (
    RetryPolicy,
    SignalTimeout,
    WorkflowContext,
    activity,
    activity_info,
    schedule,
    workflow,
)

from .models import Order

logger = logging.getLogger("example_project.orders")


class PaymentGatewayTimeout(ConnectionError):
    """What a real payment client raises when the provider does not answer in time."""


@activity(name="orders.charge_card", retry=RetryPolicy(max_attempts=5, initial_interval=0.5))
def charge_card(order_id: int) -> str:
    """Charge the customer; return the provider's receipt.

    At least once: a worker crash after the charge and before its step is recorded runs
    this again. A real provider is given ``idempotency_key`` (stable across attempts and
    re-executions) so it charges once. Here the first attempt times out, so the history
    shows the retry policy at work.
    """
    info = activity_info()
    order = Order.objects.get(pk=order_id)
    if info.attempt == 1:
        raise PaymentGatewayTimeout("the payment provider did not answer (simulated)")
    digest = hashlib.sha256(info.idempotency_key.encode()).hexdigest()[:12]
    logger.info("charged %s %s for order %s", order.customer, order.amount, order_id)
    return f"rcpt-{digest}"


@activity(name="orders.mark_paid", atomic=True)
def mark_paid(order_id: int, receipt: str) -> None:
    """Atomic: this update commits in the same transaction as the step record, so it
    happens exactly once even if the worker dies around it."""
    Order.objects.filter(pk=order_id).update(status=Order.Status.PAID, receipt=receipt)


@activity(name="orders.ship")
def ship(order_id: int) -> str:
    """Hand the order to the warehouse. Not atomic, so at least once: setting the status is
    idempotent, and a real shipping call would pass ``activity_info().idempotency_key``."""
    Order.objects.filter(pk=order_id).update(status=Order.Status.FULFILLED)
    return f"parcel-{order_id}"


@activity(name="orders.send_confirmation", queue="emails", timeout="30s")
def send_confirmation(order_id: int, parcel: str) -> str:
    """Queued: runs as a Celery task on the ``emails`` queue, on whichever worker consumes
    it, while the run waits durably. A real mailer would pass ``idempotency_key``."""
    order = Order.objects.get(pk=order_id)
    logger.info("emailed %s: order %s is on its way (%s)", order.customer, order_id, parcel)
    return f"msg-{activity_info().idempotency_key}"


def _check_gift_note(note: Any) -> None:
    if not isinstance(note, str) or not note.strip():
        raise ValueError("a gift note is a non-empty string")
    if len(note) > 140:
        raise ValueError(f"a gift note has at most 140 characters; this one has {len(note)}")


#: How long an order waits for someone to give it a warehouse slot before it ships anyway:
#: long enough for a person trying the demo to take their time.
WAREHOUSE_SLOT_TIMEOUT = "1d"


@workflow(name="orders.fulfil")
def fulfil(ctx: WorkflowContext, order_id: int) -> dict[str, Any]:
    progress: dict[str, Any] = {"stage": "charging", "gift_note": None, "warehouse_slot": None}
    # Try, while the run waits for its warehouse slot:
    #   python manage.py weft_query order-<id> progress
    ctx.on_query("progress", lambda: dict(progress))

    def add_gift_note(note: str) -> dict[str, Any]:
        progress["gift_note"] = note
        return dict(progress)

    # An update: validated before it is stored, applied at a recorded point, answered.
    ctx.on_update("add_gift_note", add_gift_note, validator=_check_gift_note)
    receipt = ctx.run(charge_card, order_id)
    ctx.run(mark_paid, order_id, receipt)
    progress["stage"] = "waiting for a warehouse slot"
    ctx.logger.info("order %s paid; waiting for a warehouse slot", order_id)
    # A durable wait for a person: the run parks, no thread waits, and a restart loses
    # nothing. Someone sends the signal (the admin's "Give a warehouse slot" action, or
    # `manage.py weft_signal order-<id> warehouse_slot --payload '"dock 3"'`); without one, the
    # order ships anyway once the timeout has passed.
    try:
        slot = ctx.wait_signal("warehouse_slot", timeout=WAREHOUSE_SLOT_TIMEOUT)
    except SignalTimeout:
        slot = "first free slot"
    progress["warehouse_slot"] = slot
    parcel = ctx.run(ship, order_id)
    progress["stage"] = "shipped"
    ctx.logger.info("order %s shipped as %s from %s", order_id, parcel, slot)
    message = ctx.run(send_confirmation, order_id, parcel)
    return {
        "order": order_id,
        "receipt": receipt,
        "warehouse_slot": slot,
        "parcel": parcel,
        "confirmation": message,
        "gift_note": progress["gift_note"],
    }


# -- a recurring workflow -------------------------------------------------------------------


@activity(name="orders.count_by_status")
def count_by_status() -> dict[str, int]:
    counts = {status: 0 for status in Order.Status.values}
    for status in Order.objects.values_list("status", flat=True):
        counts[status] += 1
    return counts


# Declared next to the workflow; `manage.py weft_schedules sync` (run by scripts/run-example)
# creates it, and Celery beat's tick fires it at 02:00 Oslo time, DST or not.
@workflow(
    name="orders.nightly_report",
    schedules=[schedule("nightly-orders-report", cron="0 2 * * *", timezone="Europe/Oslo")],
)
def nightly_report(ctx: WorkflowContext) -> dict[str, Any]:
    """Counts the orders by status, for the night's scheduled time."""
    counts = ctx.run(count_by_status)
    day = ctx.info.scheduled_at or ctx.now()
    ctx.logger.info("orders on %s: %s", day.date(), counts)
    return {"scheduled_at": day.isoformat(), "orders": counts}


# -- a subscription trial: a month of waiting, then a week's grace ----------------------------

#: How long a trial of the monthly coffee subscription lasts.
TRIAL_LENGTH = "30d"
#: How long the customer then has to add a payment method before the trial lapses.
PAYMENT_GRACE = "7d"
MONTHLY_PRICE = Decimal("12.00")


@activity(name="orders.send_trial_ending")
def send_trial_ending(customer: str) -> str:
    """Email the customer that the trial is over and a payment method is needed. A real
    mailer would be given ``activity_info().idempotency_key``."""
    logger.info("emailed %s: the trial has ended; add a card to keep the subscription", customer)
    return f"msg-{activity_info().idempotency_key}"


@activity(
    name="orders.charge_subscription",
    retry=RetryPolicy(max_attempts=4, initial_interval="1h", backoff=2, max_interval="4h"),
)
def charge_subscription(customer: str, card: str) -> str:
    """Charge the first month to the customer's card; return the provider's receipt.

    A card that is declined for now, or a provider that does not answer, is tried again
    an hour later, then two hours and four hours after that: payment problems clear up
    in hours, not seconds. The run waits durably meanwhile (a timer, no worker)."""
    digest = hashlib.sha256(activity_info().idempotency_key.encode()).hexdigest()[:12]
    logger.info("charged %s %s to card %s", customer, MONTHLY_PRICE, card)
    return f"rcpt-{digest}"


@activity(name="orders.open_subscription_order", atomic=True)
def open_subscription_order(customer: str, receipt: str) -> int:
    """The first month's order, paid. Atomic: created once, with the step that records it."""
    order = Order.objects.create(
        customer=customer, amount=MONTHLY_PRICE, status=Order.Status.PAID, receipt=receipt
    )
    return order.pk


@workflow(name="orders.subscription_trial")
def subscription_trial(ctx: WorkflowContext, customer: str) -> dict[str, Any]:
    """A 30-day trial of the monthly subscription, then a week to add a payment method.

    Start it with ``client.start("orders.subscription_trial", args=["Ada"], id="trial-ada")``;
    the customer's card arrives as the ``payment_method_added`` signal (``{"card": ...}``).
    Its tests (``example_project/orders/tests/``) live through the 37 days in well under a
    second, on the ``weft`` fixture's virtual clock."""
    ctx.sleep(TRIAL_LENGTH)
    ctx.run(send_trial_ending, customer)
    try:
        payment = ctx.wait_signal("payment_method_added", timeout=PAYMENT_GRACE)
    except SignalTimeout:
        ctx.logger.info("the trial of %s lapsed without a payment method", customer)
        return {"customer": customer, "outcome": "lapsed", "at": ctx.now().isoformat()}
    receipt = ctx.run(charge_subscription, customer, payment["card"])
    order = ctx.run(open_subscription_order, customer, receipt)
    return {
        "customer": customer,
        "outcome": "subscribed",
        "order": order,
        "receipt": receipt,
        "at": ctx.now().isoformat(),
    }
