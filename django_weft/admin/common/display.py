"""How the admin shows values: a run status as a badge, JSON in a ``<pre>``, a time to the
second, a run as a link, a long error shortened."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, tzinfo
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ...models import WorkflowRun
from .urls import admin_url


def status_badge(status: str) -> SafeString:
    """A run status as a coloured badge (``weft-badge weft-badge-<status>``, ``_`` as ``-``)."""
    if status not in WorkflowRun.Status.values:
        return format_html('<span class="weft-badge weft-badge-unknown">{}</span>', status)
    label = WorkflowRun.Status(status).label
    return format_html('<span class="weft-badge weft-badge-{}">{}</span>', status.replace("_", "-"), label)


def pretty_json(value: Any) -> SafeString:
    """A JSON value indented in a ``<pre>`` (escaped)."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre class="weft-json">{}</pre>', text)


def moment(value: datetime | None) -> str:
    """A time to the second, in the current time zone; "-" for none."""
    if value is None:
        return "-"
    return date_format(timezone.localtime(value), "Y-m-d H:i:s")


def zoned_moment(value: datetime | None, tz: tzinfo | None = None) -> SafeString | str:
    """A time to the second with its zone, as ``<time>``: in ``tz`` (default: the current
    time zone, Django's ``TIME_ZONE`` or the one activated for the request) followed by the
    zone's abbreviation, and in UTC on hover; "-" for none."""
    if value is None:
        return "-"
    utc = value.astimezone(UTC)
    local = timezone.localtime(value, tz)
    return format_html(
        '<time datetime="{}" title="{} UTC">{} {}</time>',
        utc.isoformat(),
        utc.strftime("%Y-%m-%d %H:%M:%S"),
        local.strftime("%Y-%m-%d %H:%M:%S"),
        local.tzname() or str(local.tzinfo),
    )


def json_block(label: str, value: Any, *, folded: bool | None = None, key: str = "") -> SafeString:
    """A JSON value under a ``<summary>`` that folds it, at full width: ``label``, then how
    big it is. Open unless ``folded`` (default: folded past :data:`JSON_OPEN_LINES` lines).
    ``key`` names it for the page's refresh, which keeps what the reader opened."""
    shown = pretty_json(value)
    lines = shown.count("\n") + 1
    if folded is None:
        folded = lines > JSON_OPEN_LINES
    size = f"{lines} lines" if lines > 1 else ""
    return format_html(
        '<details class="weft-json-block" data-key="{}"{}><summary>{} <span class="weft-quiet">{}</span>'
        "</summary>{}</details>",
        key or label,
        "" if folded else SafeString(" open"),
        label,
        size,
        shown,
    )


JSON_OPEN_LINES = 40
"""A JSON value longer than this many lines starts folded on a run's page."""


def moment_field(column: str, description: str) -> Callable[[Any, Any], str]:
    """A read-only admin field showing the time in ``column`` to the second."""

    @admin.display(description=description, ordering=column)
    def show(model_admin: Any, obj: Any) -> str:
        return moment(getattr(obj, column))

    return show


def run_link(run: WorkflowRun) -> SafeString:
    """A run's page as a link (its workflow and workflow id), then its status badge."""
    url = admin_url(WorkflowRun, "change", run.pk)
    return format_html(
        '<a href="{}">{} {}</a> {}', url, run.workflow_name, run.workflow_id, status_badge(run.status)
    )


def shorten(text: str, limit: int = 200) -> str:
    """``text`` on one line, cut to ``limit`` characters (an error in a message)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def listed(labels: Any, shown: int) -> str:
    """The first ``shown`` labels, then how many more: "a, b and 3 more"."""
    every = list(labels)
    text = ", ".join(every[:shown])
    rest = len(every) - shown
    return f"{text} and {rest} more" if rest > 0 else text


__all__ = [
    "JSON_OPEN_LINES",
    "json_block",
    "listed",
    "moment",
    "moment_field",
    "pretty_json",
    "run_link",
    "shorten",
    "status_badge",
    "zoned_moment",
]
