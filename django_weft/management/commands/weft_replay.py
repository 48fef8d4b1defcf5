"""``manage.py weft_replay``: replay stored histories against the current code (read-only)
and report, per run, the first divergence or OK; exit code 1 when a run fails the check."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ... import runtime
from ...engine.errors import WeftError
from ._histories import BAD_INPUT, add_selection_arguments, selection

FAILED_CHECK = 1


class Command(BaseCommand):
    help = (
        "Replay stored run histories (from the database, or files written by weft_export_history) "
        "against the workflow code of this checkout, writing nothing and running no activity. Prints "
        "a line per run (OK, DIVERGED with the first divergence, or MISSING workflow) and a summary; "
        "exits with 1 when a run diverged or a live run's workflow is missing, 2 on bad input."
    )

    def add_arguments(self, parser: Any) -> None:
        add_selection_arguments(
            parser, runs_help="only this run: a run id, or a workflow id for its latest run (repeatable)"
        )
        parser.add_argument(
            "--from-file", dest="files", action="append", default=[], metavar="PATH",
            help="replay the history files at PATH (a weft_export_history file, or a directory of "
            "them) instead of the database (repeatable); the run filters do not apply",
        )  # fmt: skip
        parser.add_argument(
            "--quiet", action="store_true", help="print only the runs that fail the check, and the summary"
        )
        parser.add_argument(
            "--format", choices=("text", "json"), default="text",
            help="text (default): a line per run; json: a JSON object per line, then a summary object",
        )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        if options["files"] and (
            options["refs"] or options["workflows"] or options["statuses"] or options["since"]
        ):
            raise CommandError(
                "--from-file replays the files given; --run, --workflow, --status and --since select "
                "stored runs: use one or the other",
                returncode=BAD_INPUT,
            )
        replays: Iterator[runtime.RunReplay]
        if options["files"]:
            replays = runtime.replay_files(options["files"])
        else:
            replays = runtime.replay_runs(selection(options), batch=options["batch"])
        as_json, quiet = options["format"] == "json", options["quiet"]
        summary = runtime.ReplaySummary()
        try:
            for replay in replays:
                summary.add(replay)
                if quiet and not replay.fails_check:
                    continue
                if as_json:
                    self.stdout.write(json.dumps({"type": "run", **replay.as_dict()}, default=str))
                else:
                    self.stdout.write(replay.line())
        except WeftError as exc:
            raise CommandError(exc.message, returncode=BAD_INPUT) from None
        if as_json:
            self.stdout.write(json.dumps({"type": "summary", **summary.as_dict()}))
        else:
            self.stdout.write(summary.line())
        if summary.failed:
            failing = summary.failing
            raise CommandError(
                f"{failing} run{'s' if failing != 1 else ''} failed the replay check: this code would "
                "stop them (see the DIVERGED and MISSING lines)",
                returncode=FAILED_CHECK,
            )
