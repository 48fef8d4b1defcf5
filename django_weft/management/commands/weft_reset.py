"""``manage.py weft_reset``: start a new run of a run's workflow id from a position of its history."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ... import runtime
from ...engine.errors import WeftError
from ...runtime.operations import RESET_REASON


def _json(raw: str | None, option: str, kind: type) -> Any:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise CommandError(f"{option} must be JSON: {exc}") from None
    if not isinstance(value, kind):
        raise CommandError(f"{option} must be a JSON {'list' if kind is list else 'object'}; got {raw}")
    return value


class Command(BaseCommand):
    help = (
        "Reset a run to a position of its history: a new run of its workflow id replays the "
        "entries before --to-seq (nothing in them runs again) and continues live from there. "
        "The run, if still active, is closed and linked to the new one. Refused, with nothing "
        "written, for a position the history cannot be cut at or a run that is not the latest "
        "of its workflow id."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run", help="run id, or workflow id (its latest run)")
        parser.add_argument(
            "--to-seq",
            type=int,
            required=True,
            help="the position to continue live from (the entries before it are kept); see the history",
        )
        parser.add_argument(
            "--reason",
            required=True,
            help=f"why, stored on both runs (at most {RESET_REASON.max_length} characters)",
        )
        # Not "args"/"kwargs" as destinations: call_command passes its own under those names.
        parser.add_argument(
            "--args", dest="input_args", help="new positional input, a JSON list (default: the run's)"
        )
        parser.add_argument(
            "--kwargs", dest="input_kwargs", help="new keyword input, a JSON object (default: the run's)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        new_args = _json(options.get("input_args"), "--args", list)
        new_kwargs = _json(options.get("input_kwargs"), "--kwargs", dict)
        try:
            outcome = runtime.reset(
                options["run"], options["to_seq"], args=new_args, kwargs=new_kwargs, reason=options["reason"]
            )
        except WeftError as exc:
            raise CommandError(exc.message) from exc
        closed = ""
        if outcome.closed:
            closed = f"; run {outcome.reset_from} was {outcome.previous_status}, now cancelled"
        self.stdout.write(
            f"reset run {outcome.reset_from} to position {outcome.to_seq}: new run {outcome.run_id} "
            f"({outcome.workflow_name} {outcome.workflow_id}){closed}"
        )
