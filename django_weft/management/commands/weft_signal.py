"""``manage.py weft_signal``: send a signal to a run."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ... import runtime
from ...engine.errors import WeftError


class Command(BaseCommand):
    help = "Send a signal to a run (by run id, or workflow id for its latest run)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run", help="run id, or workflow id (its latest run)")
        parser.add_argument("name", help="signal name")
        parser.add_argument("--payload", default="null", help="the payload as JSON (default: null)")
        parser.add_argument("--signal-id", help="idempotency key: a repeat is accepted once")

    def handle(self, *args: Any, **options: Any) -> None:
        payload = parse_json(options["payload"], "--payload")
        try:
            accepted = runtime.signal(
                options["run"], options["name"], payload, signal_id=options["signal_id"]
            )
        except WeftError as exc:
            raise CommandError(exc.message) from exc
        state = "already accepted before" if accepted.duplicate else "accepted"
        self.stdout.write(
            f"signal {accepted.name} to run {accepted.run_id}: {state} (#{accepted.sequence}, "
            f"{accepted.received_at.isoformat()})"
        )


def parse_json(text: str, option: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(f"{option} must be JSON ({exc}); for a string, quote it: '\"text\"'") from exc
