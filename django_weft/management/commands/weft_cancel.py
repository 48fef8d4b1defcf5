"""``manage.py weft_cancel``: cancel a run now."""

from __future__ import annotations

from typing import Any

from ... import runtime
from ._lifecycle import LifecycleCommand


class Command(LifecycleCommand):
    help = "Cancel a run now: its worker is deposed, its timers removed, its pending updates failed."
    verb = "cancelled"

    def add_arguments(self, parser: Any) -> None:
        super().add_arguments(parser)
        parser.add_argument("--reason", help="why, stored with the run and shown to result() callers")

    def transition(self, options: dict[str, Any]) -> str:
        return runtime.cancel(options["run"], options.get("reason"))
