"""``manage.py weft_export_history``: write runs' histories as ``django_weft.history``
documents, which ``weft_replay --from-file`` and ``django_weft.testing.replay`` read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ... import runtime
from ...engine.errors import WeftError
from ._histories import BAD_INPUT, add_selection_arguments, selection


class Command(BaseCommand):
    help = (
        "Export run histories as django_weft.history JSON documents: one run to standard output "
        "(weft_export_history RUN > history.json), or every selected run to a file <run id>.json "
        "in --output-dir."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "runs", nargs="*", metavar="RUN", help="run ids, or workflow ids meaning their latest run"
        )
        add_selection_arguments(parser, runs_help="the same as a RUN argument (repeatable)")
        parser.add_argument(
            "--output-dir", metavar="DIR",
            help="write each selected run to DIR/<run id>.json (created if needed) instead of to "
            "standard output; without RUN arguments, every run the filters select",
        )  # fmt: skip
        parser.add_argument(
            "--indent", type=int, default=2, help="JSON indentation (default 2; 0 for one line)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        options["refs"] = [*options["runs"], *options["refs"]]
        output_dir = options["output_dir"]
        if output_dir is None and len(options["refs"]) != 1:
            raise CommandError(
                "name one run to write it to standard output (weft_export_history RUN > history.json), "
                "or give --output-dir to write several runs, one file each",
                returncode=BAD_INPUT,
            )
        indent = options["indent"] or None
        try:
            if output_dir is None:
                document = runtime.export_history(options["refs"][0])
                self.stdout.write(json.dumps(document, indent=indent, ensure_ascii=False))
                return
            target = Path(output_dir)
            try:
                target.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CommandError(f"--output-dir {output_dir}: {exc}", returncode=BAD_INPUT) from None
            written = 0
            for document in runtime.stored_documents(selection(options), batch=options["batch"]):
                run = document["run"]
                path = target / f"{run['run_id']}.json"
                path.write_text(
                    json.dumps(document, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8"
                )
                written += 1
                if options["verbosity"] > 1:
                    self.stdout.write(
                        f"wrote {path} ({run['workflow']} {run['workflow_id']}, "
                        f"{len(document['steps'])} steps)"
                    )
        except WeftError as exc:
            raise CommandError(exc.message, returncode=BAD_INPUT) from None
        self.stdout.write(f"exported {written} run{'s' if written != 1 else ''} to {target}")
