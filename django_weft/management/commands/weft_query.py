"""``manage.py weft_query``: ask a run a query and print the answer as JSON."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ... import runtime
from ...engine.errors import WeftError
from .weft_signal import parse_json


class Command(BaseCommand):
    help = "Answer a query of a run from its recorded history (read-only) and print the result as JSON."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run", help="run id, or workflow id (its latest run)")
        parser.add_argument("name", help="query name")
        parser.add_argument(
            "--args",
            dest="query_args",
            default="[]",
            help="the query's arguments as a JSON list (default: [])",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        values = parse_json(options["query_args"], "--args")
        if not isinstance(values, list):
            raise CommandError("--args must be a JSON list, for example '[1, \"a\"]'")
        try:
            result = runtime.query(options["run"], options["name"], values)
        except WeftError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(json.dumps(result, indent=2, sort_keys=True, default=str))
