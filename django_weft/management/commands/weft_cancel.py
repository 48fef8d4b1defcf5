"""``manage.py weft_cancel``: cancel a run now, or send it a cancellation request."""

from __future__ import annotations

from typing import Any

from ... import runtime
from ...runtime.operations import CANCEL_REASON
from ._lifecycle import LifecycleCommand


class Command(LifecycleCommand):
    help = (
        "Cancel a run now: its worker is deposed, its timers removed, its pending updates failed. "
        "With --request, send the workflow a cancellation request instead: it receives it at its "
        "current or next blocking point and may clean up before it finishes cancelled."
    )
    verb = "cancelled"

    def add_arguments(self, parser: Any) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--reason",
            help="why, stored with the run and shown to result() callers "
            f"(at most {CANCEL_REASON.max_length} characters)",
        )
        parser.add_argument(
            "--request",
            action="store_true",
            help="request cancellation (the workflow can clean up) instead of cancelling now",
        )

    def transition(self, options: dict[str, Any]) -> str:
        if options.get("request"):
            self.verb = "asked to cancel"
            return runtime.cancel(options["run"], options.get("reason"), mode="request")
        return runtime.cancel(options["run"], options.get("reason"))
