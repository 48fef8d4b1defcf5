"""The documentation site's generated and hand-written reference pages match the code.

The test command builds the site with ``mkdocs build --strict`` (a broken link, a page
left out of the nav or a docstring that does not render fails it); these tests check
what that build cannot: that the reference covers everything it should.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from django.core.management import get_commands

import django_weft
from django_weft.api.urls import urlpatterns

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

pytestmark = pytest.mark.database_independent


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("weft_docs_hooks", DOCS / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_commands_page_has_every_command_with_its_options() -> None:
    page = _hooks()._commands_reference()
    names = sorted(name for name, app in get_commands().items() if app == "django_weft")
    assert len(names) >= 10
    assert re.findall(r"^## (weft_\w+)$", page, re.MULTILINE) == names
    for option in ("--threads", "--shutdown-timeout", "--payload", "--signal-id", "--prune", "--dry-run"):
        assert option in page
    assert "--pythonpath" not in page  # Django's common options are said once, not repeated


def test_the_openapi_page_has_every_operation_and_schema() -> None:
    hooks = _hooks()
    schema = hooks._openapi_schema()
    page = hooks.OpenApiMarkdown(schema).render()
    operations = re.findall(r"^### (GET|POST|PUT|PATCH|DELETE) `([^`]+)`", page, re.MULTILINE)
    expected = [
        (method.upper(), route.removeprefix("/api/weft/"))
        for route, item in schema["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    ]
    assert operations == expected
    assert len(operations) >= 25
    assert {"runs/{ref}/signal/", "runs/{ref}/update/", "schedules/{id}/backfill/"} <= {
        r for _, r in operations
    }
    # Every schema a type column links to has its section.
    anchors = set(re.findall(r"\{ #(schema-[a-z0-9-]+) \}", page))
    assert set(re.findall(r"\]\(#(schema-[a-z0-9-]+)\)", page)) <= anchors
    assert len(anchors) == len(schema["components"]["schemas"])
    # The schema is the API's: the routes the URLconf serves, the schema pages left out.
    served = {str(pattern.pattern) for pattern in urlpatterns}
    assert "schema/" in served and not any("schema" in route for _, route in operations)


def test_the_checks_page_lists_exactly_the_checks_the_code_has() -> None:
    source = (REPO / "django_weft" / "checks.py").read_text()
    in_code = set(re.findall(r"\b([EW]\d{3})\b", source))
    in_docs = set(
        re.findall(r"^\| `django_weft\.([EW]\d{3})` \|", (DOCS / "reference" / "checks.md").read_text(), re.M)
    )
    assert len(in_code) >= 20
    assert in_docs == in_code


def test_every_public_name_has_a_python_reference_entry() -> None:
    pages = "\n".join(path.read_text() for path in (DOCS / "reference" / "python").glob("*.md"))
    directives = set(re.findall(r"^::: ([\w.]+)$", pages, re.MULTILINE))
    missing = []
    for name in django_weft.__all__:
        if f"django_weft.{name}" in directives:
            continue
        obj = getattr(django_weft, name)
        if inspect.ismodule(obj):  # the client: each of its functions and classes
            missing += [
                f"{obj.__name__}.{member}"
                for member, value in vars(obj).items()
                if not member.startswith("_")
                and getattr(value, "__module__", None) == obj.__name__
                and f"{obj.__name__}.{member}" not in directives
            ]
        elif obj.__module__ not in directives:  # or documented with its whole module (errors)
            missing.append(name)
    assert not missing, f"not in docs/reference/python/: {missing}"


def test_the_nav_names_every_page_and_the_tutorial_comes_first() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())

    def pages(items: list[object]) -> list[str]:
        found: list[str] = []
        for item in items:
            if isinstance(item, str):
                found.append(item)
            elif isinstance(item, dict):
                for value in item.values():
                    found.extend(pages(value) if isinstance(value, list) else [value])
        return found

    nav = pages(config["nav"])
    assert nav[:2] == ["index.md", "tutorial.md"]
    on_disk = sorted(str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md"))
    assert sorted(nav) == on_disk


def test_repository_links_become_paths_or_repository_urls() -> None:
    hooks = _hooks()
    text = "See the [example project](../example_project/) and the [status](../README.md#status)."
    assert hooks._repository_links(text, Path("quickstart.md"), None) == (
        "See the example project (`example_project/` in the repository) and the status "
        "(`README.md` in the repository)."
    )
    assert hooks._repository_links(text, Path("quickstart.md"), "https://example.org/weft") == (
        "See the [example project](https://example.org/weft/tree/main/example_project/) and the "
        "[status](https://example.org/weft/blob/main/README.md#status)."
    )
    page_link = "[Settings](reference/settings.md#weft_retention)"
    assert hooks._repository_links(page_link, Path("index.md"), None) == page_link
