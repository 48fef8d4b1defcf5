"""``manage.py demo_order``: create orders and start their fulfilment workflows."""

from __future__ import annotations

import argparse
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from django_weft import InvalidInput, ResultTimeout, WeftError, client
from django_weft.client import WorkflowHandle
from django_weft.runtime.operations import START_PRIORITY

from ...models import Order


class Command(BaseCommand):
    help = (
        "Create an Order and start the orders.fulfil workflow for it; print its workflow id and "
        "run id. With --count, create many orders from --threads threads (a load demo)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--customer", default="Ada Lovelace", help="customer name")
        parser.add_argument("--amount", default="42.00", help="order amount (default: 42.00)")
        parser.add_argument(
            "--slot",
            metavar="TEXT",
            help="send the warehouse_slot signal with this payload right after the start "
            "(the order otherwise waits for one for a few minutes)",
        )
        parser.add_argument(
            "--priority",
            type=priority,
            default=START_PRIORITY.default,
            help=f"the runs' priority, {START_PRIORITY.minimum} to {START_PRIORITY.maximum}, higher "
            f"first (default {START_PRIORITY.default}): they go to workers before runs of lower priority",
        )
        parser.add_argument("--count", type=int, default=1, help="how many orders (default 1)")
        parser.add_argument(
            "--threads", type=int, default=1, help="start the orders from this many threads (default 1)"
        )
        parser.add_argument(
            "--wait",
            type=float,
            metavar="SECONDS",
            help="wait up to SECONDS for the runs to finish and print the outcome "
            "(needs running workers: a Celery worker and beat, or weft_worker)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            amount = Decimal(options["amount"])
        except InvalidOperation:
            raise CommandError(f"--amount must be a number; got {options['amount']!r}") from None
        count, threads = options["count"], options["threads"]
        if count < 1:
            raise CommandError("--count must be at least 1")
        if threads < 1:
            raise CommandError("--threads must be at least 1")
        self.priority = options["priority"]
        if count == 1:
            self._one(options["customer"], amount, options["slot"], options["wait"])
        else:
            self._many(options["customer"], amount, options["slot"], options["wait"], count, threads)

    def _start(self, customer: str, amount: Decimal, slot: str | None) -> tuple[Order, WorkflowHandle]:
        order = Order.objects.create(customer=customer, amount=amount)
        try:
            handle = client.start(
                "orders.fulfil", args=[order.pk], id=order.workflow_id, priority=self.priority
            )
            if slot is not None:
                # Signals are buffered: the run takes it when it gets to its wait.
                handle.signal("warehouse_slot", slot)
        except WeftError as exc:
            raise CommandError(str(exc)) from None
        return order, handle

    def _one(self, customer: str, amount: Decimal, slot: str | None, wait: float | None) -> None:
        order, handle = self._start(customer, amount, slot)
        self.stdout.write(f"order {order.pk} created for {order.customer}, {order.amount}")
        self.stdout.write(f"workflow id: {handle.workflow_id}")
        self.stdout.write(f"run id: {handle.run_id}")
        if wait is None:
            return
        try:
            result = handle.result(timeout=wait)
        except ResultTimeout:
            raise CommandError(
                f"run {handle.run_id} is still {handle.status()} after {wait:g} s; "
                "are a Celery worker (with the emails queue) and beat running?"
            ) from None
        except WeftError as exc:
            raise CommandError(f"run {handle.run_id}: {exc}") from None
        order.refresh_from_db()
        self.stdout.write(f"run {handle.run_id}: {handle.status()}, result {result}")
        self.stdout.write(f"order {order.pk}: {order.status}, receipt {order.receipt}")

    def _many(
        self, customer: str, amount: Decimal, slot: str | None, wait: float | None, count: int, threads: int
    ) -> None:
        counter = iter(range(count))
        lock = threading.Lock()

        def start_some() -> list[WorkflowHandle]:
            handles = []
            try:
                while True:
                    with lock:
                        index = next(counter, None)
                    if index is None:
                        return handles
                    handles.append(self._start(f"{customer} #{index + 1}", amount, slot)[1])
            finally:
                close_old_connections()

        began = time.monotonic()
        with ThreadPoolExecutor(max_workers=threads) as pool:
            handles = [
                handle for batch in pool.map(lambda _: start_some(), range(threads)) for handle in batch
            ]
        self.stdout.write(
            f"started {len(handles)} orders from {threads} threads in {time.monotonic() - began:.1f} s"
        )
        if wait is None:
            return
        deadline = time.monotonic() + wait
        open_handles = list(handles)
        while open_handles and time.monotonic() < deadline:
            time.sleep(0.5)
            open_handles = [handle for handle in open_handles if handle.status() not in FINISHED]
        statuses: dict[str, int] = {}
        for handle in handles:
            status = handle.status()
            statuses[status] = statuses.get(status, 0) + 1
        summary = ", ".join(f"{number} {status}" for status, number in sorted(statuses.items()))
        self.stdout.write(f"after {time.monotonic() - began:.1f} s: {summary}")
        if statuses.get("completed", 0) != len(handles):
            raise CommandError(f"not every order completed within {wait:g} s: {summary}")


def priority(text: str) -> int:
    """An ``argparse`` type: a start's priority, in the range the runtime takes."""
    value: int | str
    try:
        value = int(text)
    except ValueError:
        value = text  # the rule refuses it, saying what it takes
    try:
        return START_PRIORITY.check(value)
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


#: The statuses a run ends in.
FINISHED = frozenset({"completed", "failed", "cancelled", "timed_out"})
