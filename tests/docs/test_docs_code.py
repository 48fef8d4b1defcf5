"""The code in the README, the quickstart, the tutorial and the how-to guides must not rot.

Every ``python`` block must parse, and every name it imports from django_weft must
exist. Everywhere in those pages (blocks and inline code), each ``ctx.<name>``,
``client.<name>``, ``handle.<name>`` and ``weft.<name>`` (the pytest fixture) must be a
real method or attribute, and each
``manage.py weft_<command>`` line must name an existing command and only options that
the command accepts. A rename or a removed option fails here, naming the page and line.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.core.management import get_commands, load_command_class

from django_weft import client
from django_weft.engine.context import WorkflowContext
from django_weft.testing import WeftTestEnvironment
from django_weft.tracing import observer as tracing_names

REPO = Path(__file__).resolve().parents[2]
PAGES = [
    REPO / "README.md",
    REPO / "docs" / "quickstart.md",
    REPO / "docs" / "tutorial.md",
    *sorted((REPO / "docs" / "how-to").glob("*.md")),
]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    code: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def _blocks(language: str) -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == language:
                line = text.count("\n", 0, match.start()) + 2
                found.append(Block(page, line, language, match.group(2)))
    return found


PYTHON_BLOCKS = _blocks("python")


def test_the_pages_have_code_to_check() -> None:
    assert len(PYTHON_BLOCKS) >= 15
    assert all(page.exists() for page in PAGES)


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=str)
def test_python_blocks_parse_and_import_only_what_exists(block: Block) -> None:
    try:
        tree = ast.parse(block.code)
    except SyntaxError as exc:
        pytest.fail(f"{block}: the block does not parse: {exc}")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("django_weft"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                if hasattr(module, alias.name):
                    continue
                try:
                    importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    pytest.fail(f"{block}: `from {node.module} import {alias.name}`: no such name")


def _instance_attributes(cls: type) -> set[str]:
    """The attributes ``cls``'s methods assign on ``self``, besides its class members."""
    names = set(dir(cls))
    for klass in cls.__mro__[:-1]:
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(klass)))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                names.add(node.attr)
    return names


# What each receiver in the docs is: ``ctx`` the workflow context, ``handle`` a run's handle,
# ``weft`` the pytest fixture.
RECEIVERS = {
    "ctx": _instance_attributes(WorkflowContext),
    "client": set(dir(client)),
    "handle": _instance_attributes(client.WorkflowHandle),
    "weft": _instance_attributes(WeftTestEnvironment),
}
MEMBER = re.compile(r"(?<![\w.])(ctx|client|handle|weft)\.([A-Za-z_]\w*)")
# ``weft.turn``, ``weft.run_id``...: the names of spans and their attributes, not the fixture's.
TRACE_NAMES = {name.split(".")[1] for name in (*tracing_names.SPANS, *tracing_names.ATTRIBUTES)}


def _mentions() -> list[tuple[str, str, str]]:
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), start=1):
            for match in MEMBER.finditer(line):
                found.append((f"{page.relative_to(REPO)}:{number}", match.group(1), match.group(2)))
    return found


def test_every_ctx_client_and_handle_member_the_docs_name_exists() -> None:
    mentions = _mentions()
    assert len(mentions) > 50
    missing = [
        f"{where}: {receiver}.{name}"
        for where, receiver, name in mentions
        if name not in RECEIVERS[receiver] and not (receiver == "weft" and name in TRACE_NAMES)
    ]
    assert not missing, "the docs name members that do not exist:\n" + "\n".join(missing)


COMMAND = re.compile(r"manage\.py (weft_\w+)([^`\n|#]*)")


def test_every_management_command_line_names_a_command_and_options_it_accepts() -> None:
    commands = get_commands()
    problems = []
    seen = 0
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), start=1):
            for match in COMMAND.finditer(line):
                seen += 1
                where, name = f"{page.relative_to(REPO)}:{number}", match.group(1)
                if name not in commands:
                    problems.append(f"{where}: no command {name}")
                    continue
                parser = load_command_class(commands[name], name).create_parser("manage.py", name)
                try:
                    words = shlex.split(match.group(2))
                except ValueError:
                    words = match.group(2).split()
                for word in words:
                    option = word.split("=", 1)[0]
                    if option.startswith("--") and option not in parser._option_string_actions:
                        problems.append(f"{where}: {name} has no option {option}")
    assert seen >= 8
    assert not problems, "\n".join(problems)


LOCAL_LINK = re.compile(r"\]\(((?!https?:|#|mailto:)[^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize(
    "page",
    [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_local_links_and_images_exist(page: Path) -> None:
    """A link or image to a file of the repository (a page, a screenshot) must exist."""
    missing = [
        target for target in LOCAL_LINK.findall(page.read_text()) if not (page.parent / target).exists()
    ]
    assert not missing, f"{page.relative_to(REPO)} links to missing files: {missing}"
