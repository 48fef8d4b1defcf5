"""``manage.py weft_tick``: run the scheduler sweep once (or in a loop)."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand

from ... import runtime
from ...conf import weft_settings


class Command(BaseCommand):
    help = "Fire due timers and re-dispatch runnable runs and expired leases, once or with --loop."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--loop", action="store_true", help="repeat every WEFT_TICK_INTERVAL")

    def handle(self, *args: Any, **options: Any) -> None:
        while True:
            report = runtime.tick()
            if options["verbosity"] > 1 or not options["loop"]:
                self.stdout.write(f"fired {report.fired} timers, dispatched {report.dispatched} runs")
            if not options["loop"]:
                return
            time.sleep(weft_settings.TICK_INTERVAL)
