"""The run selection options ``weft_replay`` and ``weft_export_history`` share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import CommandError
from django.utils import timezone

from ... import runtime
from ...engine.durations import parse_duration
from ...engine.errors import InvalidInput
from ...runtime.histories import DEFAULT_BATCH
from ._arguments import positive

BAD_INPUT = 2
"""The exit code for a command line or file these commands cannot use (1 is a failed check)."""


def add_selection_arguments(parser: Any, *, runs_help: str) -> None:
    parser.add_argument("--run", dest="refs", action="append", default=[], metavar="ID", help=runs_help)
    parser.add_argument(
        "--workflow", dest="workflows", action="append", default=[], metavar="NAME",
        help="only runs of this workflow (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--status", dest="statuses", action="append", default=[], metavar="STATUS",
        help="only runs in this status (repeatable): pending, running, waiting, suspended, "
        "completed, failed, cancelled, timed_out, continued",
    )  # fmt: skip
    parser.add_argument(
        "--since", metavar="WHEN",
        help="only runs created since then: a duration back from now (7d, 12h, 30m) or an ISO 8601 "
        "date or date and time (2025-01-31, 2025-01-31T12:00:00+00:00; without an offset, in TIME_ZONE)",
    )  # fmt: skip
    parser.add_argument(
        "--batch", type=positive, default=DEFAULT_BATCH,
        help=f"runs read per query (default {DEFAULT_BATCH})",
    )  # fmt: skip


def parse_since(text: str | None, now: datetime | None = None) -> datetime | None:
    """``--since``: a duration back from now, or an ISO 8601 date or date and time."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        try:
            seconds = parse_duration(text, what="--since")
        except InvalidInput:
            raise CommandError(
                f"--since takes a duration back from now (7d, 12h) or an ISO 8601 date or date and time; "
                f"got {text!r}",
                returncode=BAD_INPUT,
            ) from None
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    if moment.tzinfo is None:
        moment = timezone.make_aware(moment)
    return moment


def selection(options: dict[str, Any]) -> runtime.RunSelection:
    try:
        return runtime.RunSelection(
            workflows=tuple(options["workflows"]),
            statuses=tuple(options["statuses"]),
            since=parse_since(options["since"]),
            refs=tuple(options["refs"]),
        )
    except InvalidInput as exc:
        raise CommandError(exc.message, returncode=BAD_INPUT) from None
