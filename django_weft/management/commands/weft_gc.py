"""``manage.py weft_gc``: delete terminal runs past their retention, in batches."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ... import runtime
from ...engine.errors import WeftError
from ._arguments import positive


class Command(BaseCommand):
    help = (
        "Delete terminal runs past their retention (WEFT_RETENTION, @workflow(retention=...)) with "
        "their steps, timers, signals and updates, one batch per transaction, printing a line per batch."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="report what would be deleted, and delete nothing"
        )
        parser.add_argument(
            "--batch", type=positive, default=None, help="runs per batch (default: WEFT_TICK_BATCH)"
        )
        parser.add_argument("--limit", type=positive, default=None, help="stop after deleting this many runs")

    def handle(self, *args: Any, **options: Any) -> None:
        verbose = options["verbosity"] > 0
        try:
            report = runtime.purge_expired(
                batch=options["batch"],
                limit=options["limit"],
                dry_run=options["dry_run"],
                on_batch=(lambda batch: self.stdout.write(batch.line())) if verbose else None,
            )
        except WeftError as exc:
            raise CommandError(str(exc)) from None
        if verbose:
            self.stdout.write(report.summary())
