"""What the documentation site generates when it is built (mkdocs ``hooks:`` in mkdocs.yml).

- The management commands' reference, from each command's own argparse parser.
- The REST API's schema reference, from the OpenAPI schema drf-spectacular generates for
  django_weft's routes, rendered to Markdown (tables, no JavaScript, nothing fetched).
- Links from a page to a repository file outside ``docs/`` (the example project, the
  README): they work on GitHub as they are; on the site they point at ``repo_url`` when
  mkdocs.yml has one and are shown as the file's path otherwise. A link to a file that
  does not exist fails the build (``--strict``).
- A griffe extension that turns the reST roles of the package's docstrings
  (``:func:`x```, ``:class:`~a.B```) into code spans, and ``Example::`` into ``Example:``.

The pages to fill name what they want with a marker comment, ``<!-- weft: commands -->``
or ``<!-- weft: openapi -->``, so the Markdown reads sensibly on GitHub too.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import re
from pathlib import Path
from typing import Any

import griffe

log = logging.getLogger("mkdocs.hooks.weft")

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
MARKER = re.compile(r"^<!-- weft: (\w+) -->$", re.MULTILINE)
API_PREFIX = "api/weft/"


# -- Django, configured once for the build --------------------------------------------------


def _django() -> None:
    """Configure a minimal project (no database is touched) so that the commands and the
    API's schema can be loaded exactly as a project sees them."""
    import django
    from django.conf import settings

    if settings.configured:
        return
    settings.configure(
        INSTALLED_APPS=[
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "rest_framework",
            "django_filters",
            "drf_spectacular",
            "django_weft",
        ],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        USE_TZ=True,
        SECRET_KEY="docs-build-only",
        WEFT_DISPATCHER="django_weft.runtime.dispatch.SweepOnlyDispatcher",
    )
    django.setup()


def on_config(config: Any) -> Any:
    _django()
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = MARKER.sub(lambda match: GENERATORS[match.group(1)](), markdown)
    return _repository_links(markdown, Path(page.file.src_path), config.get("repo_url"))


# -- management commands --------------------------------------------------------------------

# Options every Django command has; the page says so once instead of repeating them.
_BASE_OPTIONS = {
    "help",
    "version",
    "verbosity",
    "settings",
    "pythonpath",
    "traceback",
    "no_color",
    "force_color",
    "skip_checks",
}


def _commands_reference() -> str:
    from django.core.management import get_commands, load_command_class

    sections = []
    for name, app in sorted(get_commands().items()):
        if app != "django_weft":
            continue
        command = load_command_class(app, name)
        parser = command.create_parser("manage.py", name)
        sections.append(f"## {name}\n\n{_plain(str(command.help))}\n\n```text\n{_help(parser)}```\n")
    if not sections:
        raise RuntimeError("no django_weft management command found: is django_weft installed?")
    return "\n".join(sections)


def _help(parser: argparse.ArgumentParser) -> str:
    for action in parser._actions:
        if action.dest in _BASE_OPTIONS:
            action.help = argparse.SUPPRESS
    parser.description = None  # the section's paragraph says it
    text = parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub_parser in action.choices.items():
                sub_parser.description = None
                sub_parser._actions[0].help = argparse.SUPPRESS  # -h
                text += f"\n{sub_name}:\n" + sub_parser.format_help()
    return text


def _plain(text: str) -> str:
    return " ".join(text.split())


# -- OpenAPI --------------------------------------------------------------------------------


def _openapi_schema() -> dict[str, Any]:
    from django.urls import include, path
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.renderers import OpenApiJsonRenderer
    from drf_spectacular.settings import patched_settings

    from django_weft.api.schema import WeftSchemaView

    patterns = [path(API_PREFIX, include("django_weft.api.urls"))]
    with patched_settings(WeftSchemaView.custom_settings):
        schema = SchemaGenerator(patterns=patterns).get_schema(request=None, public=True)
    # Through the JSON renderer, as the schema/ route serves it (lazy strings, enums).
    return dict(json.loads(OpenApiJsonRenderer().render(schema)))


def _openapi_reference() -> str:
    return OpenApiMarkdown(_openapi_schema()).render()


class OpenApiMarkdown:
    """The operations and the schemas of an OpenAPI 3 document as Markdown."""

    METHODS = ("get", "post", "put", "patch", "delete")

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.schemas: dict[str, Any] = document.get("components", {}).get("schemas", {})
        descriptions = [
            operation.get("description", "")
            for item in document["paths"].values()
            for method, operation in item.items()
            if method in self.METHODS
        ]
        # The viewset's docstring is every one of its operations' description: say it once.
        self.repeated = {text for text in descriptions if text and descriptions.count(text) > 2}

    def render(self) -> str:
        out = ["## Operations\n"]
        for route, item in self.document["paths"].items():
            for method in self.METHODS:
                if method in item:
                    out.append(self._operation(route, method, item[method]))
        out.append("## Schemas\n")
        for name in sorted(self.schemas):
            out.append(self._schema(name, self.schemas[name]))
        return "\n".join(out)

    def _operation(self, route: str, method: str, operation: dict[str, Any]) -> str:
        short = route.removeprefix("/" + API_PREFIX)
        lines = [f"### {method.upper()} `{short}` {{ #{operation['operationId']} }}\n"]
        if operation.get("summary"):
            lines.append(f"{_cell(operation['summary'])}.\n".replace("..\n", ".\n"))
        description = operation.get("description", "")
        if description and description not in self.repeated:
            lines.append(description.strip() + "\n")
        parameters = operation.get("parameters", [])
        if parameters:
            lines += ["| parameter | in | type | required | description |", "| --- | --- | --- | --- | --- |"]
            for parameter in parameters:
                kind = self._type(parameter.get("schema", {}))
                lines.append(
                    f"| `{parameter['name']}` | {parameter['in']} | {kind} "
                    f"| {'yes' if parameter.get('required') else 'no'} "
                    f"| {_cell(parameter.get('description', ''))} |"
                )
            lines.append("")
        body = operation.get("requestBody")
        if body:
            types = ", ".join(
                f"{self._type(content.get('schema', {}))} (`{media}`)"
                for media, content in body.get("content", {}).items()
            )
            lines.append(f"Request body: {types}{'' if body.get('required') else ', optional'}.\n")
        # Statuses with the same description and body share a row (the error envelope's).
        rows: dict[tuple[str, str], list[str]] = {}
        for status, response in operation.get("responses", {}).items():
            content = response.get("content", {})
            shapes = ", ".join(self._type(c.get("schema", {})) for c in content.values()) or "none"
            rows.setdefault((_cell(response.get("description", "")), shapes), []).append(status)
        lines += ["| status | description | body |", "| --- | --- | --- |"]
        for (description, shapes), statuses in rows.items():
            lines.append(f"| {', '.join(sorted(statuses))} | {description} | {shapes} |")
        return "\n".join(lines) + "\n"

    def _schema(self, name: str, schema: dict[str, Any]) -> str:
        lines = [f"### {name} {{ #{_anchor(name)} }}\n"]
        if schema.get("description"):
            lines.append(schema["description"].strip() + "\n")
        properties = schema.get("properties")
        if properties:
            required = set(schema.get("required", []))
            lines += ["| field | type | required | description |", "| --- | --- | --- | --- |"]
            for field, spec in properties.items():
                flags = [] if not spec.get("readOnly") else ["read-only"]
                lines.append(
                    f"| `{field}` | {self._type(spec)} | {'yes' if field in required else 'no'} "
                    f"| {_cell(' '.join([*flags, spec.get('description', '')]))} |"
                )
        else:
            lines.append(f"{self._type(schema, own=True)}.")
        return "\n".join(lines) + "\n"

    def _type(self, schema: dict[str, Any], *, own: bool = False) -> str:
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            return f"[{name}](#{_anchor(name)})"
        for combinator, word in (("oneOf", " or "), ("anyOf", " or "), ("allOf", " and ")):
            if combinator in schema:
                kind = word.join(self._type(part) for part in schema[combinator])
                return kind + (" or null" if schema.get("nullable") else "")
        if "enum" in schema:
            kind = "one of " + ", ".join(f"`{value}`" for value in schema["enum"] if value not in ("", None))
        elif schema.get("type") == "array":
            kind = f"array of {self._type(schema.get('items', {}))}"
        elif schema.get("type") == "object" and "additionalProperties" in schema and not own:
            values = schema["additionalProperties"]
            kind = "object" if values in (True, {}) else f"object of {self._type(values)}"
        elif "type" in schema:
            kind = str(schema["type"]) + (f" ({schema['format']})" if "format" in schema else "")
        else:
            kind = "any JSON value"
        return kind + (" or null" if schema.get("nullable") else "")


def _anchor(name: str) -> str:
    return "schema-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _cell(text: str) -> str:
    """Text for one table cell: one line, pipes and angle brackets escaped, without the
    list of an enum's values that drf-spectacular appends (the type column has them)."""
    kept = [line for line in str(text).splitlines() if not line.startswith("* `")]
    parts = " ".join(" ".join(kept).split()).split("`")
    # Outside code spans only: inside one, an entity would show as typed.
    text = "`".join(part if index % 2 else html.escape(part, quote=False) for index, part in enumerate(parts))
    return text.replace("|", "\\|")


GENERATORS = {"commands": _commands_reference, "openapi": _openapi_reference}


# -- links to repository files outside docs/ ------------------------------------------------

LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(((?!https?:|mailto:|#)[^)\s#]+)(#[^)]*)?\)")


def _repository_links(markdown: str, page: Path, repo_url: str | None) -> str:
    def replace(match: re.Match[str]) -> str:
        text, target, fragment = match.group(1), match.group(2), match.group(3) or ""
        resolved = (DOCS / page.parent / target).resolve()
        if resolved.is_relative_to(DOCS):
            return match.group(0)  # a page of the site: mkdocs checks it
        if not resolved.exists():
            log.warning("Doc file '%s' links to '%s', which does not exist", page, target)
            return match.group(0)
        where = resolved.relative_to(REPO).as_posix() + ("/" if resolved.is_dir() else "")
        if repo_url:
            kind = "tree" if resolved.is_dir() else "blob"
            return f"[{text}]({repo_url.rstrip('/')}/{kind}/main/{where}{fragment})"
        return f"{text} (`{where}` in the repository)"

    return LINK.sub(replace, markdown)


# -- docstrings -----------------------------------------------------------------------------

ROLE = re.compile(r":(?:func|meth|class|exc|attr|data|mod|obj):`(~?)([^`]+)`")


def _role(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


class ReSTRoles(griffe.Extension):
    """Docstrings here are written for reading in the source; render their reST bits."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None:
            return
        text = ROLE.sub(_role, obj.docstring.value)
        obj.docstring.value = re.sub(r"::$", ":", text, flags=re.MULTILINE)
