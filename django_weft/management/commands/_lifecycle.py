"""The shared body of ``weft_cancel``, ``weft_suspend``, ``weft_resume`` and ``weft_retry``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...engine.errors import WeftError


class LifecycleCommand(BaseCommand):
    verb = ""

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run", help="run id, or workflow id (its latest run)")

    def transition(self, options: dict[str, Any]) -> str:
        raise NotImplementedError

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            status = self.transition(options)
        except WeftError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"{self.verb} run {options['run']}: now {status}")


def command(verb: str, help_text: str, action: Callable[[str], str]) -> type[LifecycleCommand]:
    class Command(LifecycleCommand):
        help = help_text

        def transition(self, options: dict[str, Any]) -> str:
            return action(options["run"])

    Command.verb = verb
    return Command
