"""Every ``weft_*`` management command, walked argument by argument from its own parser (a
new command, argument or option is walked without editing this test): each positional
argument and each option that takes a value carries, in turn, each odd value of a table
(NUL and other control characters, a lone surrogate, 10,000 characters, an emoji, numbers
past 64 bits and negative ones, JSON of the wrong shape, SQL metacharacters). The command
either does its work or stops with a ``CommandError`` that says what to fix; any other
exception fails, and a refused command writes nothing. On both databases."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command, get_commands, load_command_class
from django.core.management.base import CommandError

from django_weft import client
from django_weft.models import BulkJob, Schedule, Signal, Step, Update, WorkflowRun
from tests.support.odd_input import ODD_NUMBERS, ODD_TEXT

pytestmark = pytest.mark.django_db(transaction=True)

ODD = {
    **ODD_TEXT,
    **{name: str(number) for name, number in ODD_NUMBERS.items()},
    "zero": "0",
    "json-list": "[1, [2]]",
    "json-object": '{"a": {"b": null}}',
    "not-json": "{",
}
RUN = "cmd-run"
# Long-running by design: the worker and the tick loop are walked with the values that
# cannot be valid for any of their options, so an accepted value never starts a loop.
LOOPING = {"weft_worker"}
NEVER_VALID = ("nul", "nul-alone", "control", "lone-surrogate", "very-long", "emoji", "sql", "like")
SKIPPED_OPTIONS = {"--loop", "--from-file", "--output-dir", "--settings", "--pythonpath"}
"""Options that are not input to weft: Django's own, a loop, and paths on the filesystem
(an odd path is the operating system's error, shown as a ``CommandError`` elsewhere)."""


def _commands() -> list[str]:
    return sorted(name for name, app in get_commands().items() if app == "django_weft")


def _subparser(parser: argparse.ArgumentParser, prefix: list[str]) -> argparse.ArgumentParser:
    """The parser of the sub-command named by the words of ``prefix``."""
    for word in prefix:
        parser = next(a.choices[word] for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser


def _positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a for a in parser._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]


def _walk(parser: argparse.ArgumentParser, prefix: list[str]) -> Iterator[tuple[list[str], Any]]:
    """(the sub-command words, an argparse action that takes a value) of a parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield prefix, action  # an odd sub-command word
            for word, subparser in action.choices.items():
                yield from _walk(subparser, [*prefix, word])
        elif _takes_input(action):
            yield prefix, action


def _takes_input(action: argparse.Action) -> bool:
    """A positional argument, or an option of weft's own that takes a value."""
    if not action.option_strings:
        return True
    skipped = set(action.option_strings) & SKIPPED_OPTIONS or action.dest == "verbosity"
    return action.nargs != 0 and not skipped


def _base(parser: argparse.ArgumentParser) -> list[str]:
    """Valid required positional arguments: the run that exists, or a name."""
    return [
        RUN if action.dest in ("run", "ref", "runs") else "poke"
        for action in _positionals(parser)
        if action.nargs not in ("*", "?")
    ]


def _calls() -> Iterator[tuple[str, str, list[str]]]:
    for name in _commands():
        parser = load_command_class("django_weft", name).create_parser("manage.py", name)
        odd_values = {k: v for k, v in ODD.items() if name not in LOOPING or k in NEVER_VALID}
        for prefix, action in _walk(parser, []):
            subparser = _subparser(parser, prefix)
            base = [*prefix, *_base(subparser)]
            for label, value in odd_values.items():
                if isinstance(action, argparse._SubParsersAction):
                    yield name, f"sub-command={label}", [*prefix, value]
                elif action.option_strings:
                    option = action.option_strings[0]
                    yield name, f"{option}={label}", [*base, option, value]
                else:
                    argv = list(base)
                    index = len(prefix) + _positionals(subparser).index(action)
                    if index < len(argv):
                        argv[index] = value
                    else:
                        argv.append(value)
                    yield name, f"{action.dest}={label}", argv


CALLS = list(_calls())


def _written() -> tuple[int, ...]:
    models = (WorkflowRun, Step, Signal, Update, Schedule, BulkJob)
    return tuple(model.objects.count() for model in models)


def test_the_walk_covers_every_command() -> None:
    walked = {name for name, _, _ in CALLS}
    # weft_tick takes no value but its loop flag, weft_status none at all.
    assert walked == set(_commands()) - {"weft_tick", "weft_status"}, sorted(set(_commands()) - walked)
    assert len(CALLS) >= 300, len(CALLS)


@pytest.mark.parametrize("name", _commands())
def test_an_odd_argument_is_a_command_error_or_done(name: str) -> None:
    calls = [(odd, argv) for command, odd, argv in CALLS if command == name]
    for odd, argv in calls:
        if not WorkflowRun.objects.filter(workflow_id=RUN, status__in=("pending", "waiting")).exists():
            WorkflowRun.objects.filter(workflow_id=RUN).delete()
            client.start("tests.sleepy", kwargs={"seconds": 3600}, id=RUN)
        before = _written()
        try:
            call_command(name, *argv, stdout=StringIO(), stderr=StringIO())
        except CommandError as exc:
            assert str(exc).strip(), (name, odd)
            assert _written() == before, (name, odd, "a refused command wrote rows")
        except SystemExit as exc:  # argparse on a sub-command's parser
            assert exc.code != 0, (name, odd)
        except Exception as exc:
            pytest.fail(f"{name} {odd}: {type(exc).__name__}: {str(exc)[:300]}")
