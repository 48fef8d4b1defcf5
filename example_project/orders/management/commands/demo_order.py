"""``manage.py demo_order``: create an order and start its fulfilment workflow."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_weft import ResultTimeout, WeftError, client

from ...models import Order


class Command(BaseCommand):
    help = "Create an Order and start the orders.fulfil workflow for it; print the run id."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--customer", default="Ada Lovelace", help="customer name")
        parser.add_argument("--amount", default="42.00", help="order amount (default: 42.00)")
        parser.add_argument(
            "--wait",
            type=float,
            metavar="SECONDS",
            help="wait up to SECONDS for the run to finish and print its result "
            "(needs running workers: a Celery worker and beat, or weft_worker)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            amount = Decimal(options["amount"])
        except InvalidOperation:
            raise CommandError(f"--amount must be a number; got {options['amount']!r}") from None
        order = Order.objects.create(customer=options["customer"], amount=amount)
        try:
            handle = client.start("orders.fulfil", args=[order.pk], id=order.workflow_id)
        except WeftError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"order {order.pk} created for {order.customer}, {order.amount}")
        self.stdout.write(f"workflow id: {handle.workflow_id}")
        self.stdout.write(f"run id: {handle.run_id}")
        if options["wait"] is None:
            return
        try:
            result = handle.result(timeout=options["wait"])
        except ResultTimeout:
            raise CommandError(
                f"run {handle.run_id} is still {handle.status()} after {options['wait']:g} s; "
                "are a Celery worker (with the emails queue) and beat running?"
            ) from None
        except WeftError as exc:
            raise CommandError(f"run {handle.run_id}: {exc}") from None
        order.refresh_from_db()
        self.stdout.write(f"run {handle.run_id}: {handle.status()}, result {result}")
        self.stdout.write(f"order {order.pk}: {order.status}, receipt {order.receipt}")
