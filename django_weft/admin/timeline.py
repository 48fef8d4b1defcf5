"""The step timeline of a run's detail page: history entries in, SVG geometry and markup out.

Pure: no database, no request, no Django beyond HTML escaping. One row per history entry
(a fixed row height; the picture grows downwards, so a 1,000-step history stays legible
and scrolls instead of squeezing labels together), a shared time axis across the top,
and per entry one ``<g data-seq="N">`` holding its label, its bar (or marker) and a
``<title>`` tooltip. Colours come from CSS classes (``weft-kind-*``, ``weft-status-*``),
so the admin's stylesheet, light or dark, decides them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from functools import lru_cache
from typing import Any, Protocol

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

ROW_HEIGHT = 18
BAR_HEIGHT = 10
AXIS_HEIGHT = 28
LABEL_WIDTH = 280
RIGHT_MARGIN = 16
MIN_BAR_WIDTH = 2.0
LABEL_CHARS = 40
TICKS = 5

WAIT_KINDS = frozenset({"sleep", "wait", "signal", "condition", "child"})
"""Kinds whose bar is time spent waiting (drawn light), not work."""
MARKER_KINDS = frozenset({"handler", "cancel_request"})
"""Kinds drawn as a point in time: a signal or update handler applied to the run, a
cancellation request the workflow received."""
TIMES = "\u00d7"
"""The sign before a retried step's attempt number ("x3")."""


class TimelineEntry(Protocol):
    """What the timeline needs of a history entry (``runtime.HistoryEntry`` has it)."""

    @property
    def seq(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def started_at(self) -> datetime: ...
    @property
    def finished_at(self) -> datetime | None: ...
    @property
    def error(self) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class Row:
    """One history entry placed on the picture (coordinates in SVG user units)."""

    seq: int
    kind: str
    name: str
    status: str
    attempt: int
    y: float
    x: float
    width: float
    marker: bool
    waiting: bool
    open: bool
    label: str
    tooltip: str


@dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True)
class Timeline:
    """The geometry of a whole timeline: its size, the axis ticks and one row per entry."""

    width: int
    height: int
    chart_left: float
    chart_right: float
    start: datetime | None
    end: datetime | None
    ticks: tuple[Tick, ...]
    rows: tuple[Row, ...]


def layout(
    entries: Sequence[TimelineEntry], *, now: datetime, width: int = 960, tz: tzinfo | None = None
) -> Timeline:
    """Place ``entries`` (in ``seq`` order) on a time axis from the first start to the last
    finish; an entry with no finish yet (an open wait, a running attempt) runs to ``now``.
    Times in labels and tooltips are shown in ``tz`` (else as stored)."""
    chart_left, chart_right = float(LABEL_WIDTH), float(width - RIGHT_MARGIN)
    height = AXIS_HEIGHT + ROW_HEIGHT * len(entries) + 4
    if not entries:
        return Timeline(width, height, chart_left, chart_right, None, None, (), ())
    start = min(entry.started_at for entry in entries)
    end = max(max(_end_of(entry, now), entry.started_at) for entry in entries)
    span = max((end - start).total_seconds(), 0.001)
    scale = (chart_right - chart_left) / span

    def x_of(moment: datetime) -> float:
        return chart_left + (moment - start).total_seconds() * scale

    rows = []
    for index, entry in enumerate(entries):
        finished = _end_of(entry, now)
        x = x_of(entry.started_at)
        marker = entry.kind in MARKER_KINDS
        bar = max(x_of(finished) - x, MIN_BAR_WIDTH)
        rows.append(
            Row(
                seq=entry.seq,
                kind=entry.kind,
                name=entry.name,
                status=entry.status,
                attempt=entry.attempt,
                y=AXIS_HEIGHT + index * ROW_HEIGHT,
                x=round(x, 2),
                width=0.0 if marker else round(min(bar, chart_right - x + MIN_BAR_WIDTH), 2),
                marker=marker,
                waiting=entry.kind in WAIT_KINDS,
                open=entry.finished_at is None,
                label=_label(entry),
                tooltip=_tooltip(entry, now, tz),
            )
        )
    ticks = tuple(
        Tick(round(chart_left + (chart_right - chart_left) * i / (TICKS - 1), 2), _clock(start, span, i, tz))
        for i in range(TICKS)
    )
    return Timeline(width, height, chart_left, chart_right, start, end, ticks, tuple(rows))


def render(
    entries: Sequence[TimelineEntry], *, now: datetime, width: int = 960, tz: tzinfo | None = None
) -> SafeString:
    """The timeline as an inline ``<svg class="weft-timeline">`` (safe to put in a page)."""
    return render_layout(layout(entries, now=now, width=width, tz=tz))


def render_layout(timeline: Timeline) -> SafeString:
    t = timeline
    parts = [
        f'<svg class="weft-timeline" xmlns="http://www.w3.org/2000/svg" width="{t.width}" '
        f'height="{t.height}" viewBox="0 0 {t.width} {t.height}" role="img" '
        f'aria-label="Step timeline, {len(t.rows)} entries">'
    ]
    parts.append('<g class="weft-axis">')
    for tick in t.ticks:
        anchor = "start" if tick is t.ticks[0] else "end" if tick is t.ticks[-1] else "middle"
        parts.append(
            f'<line class="weft-grid" x1="{tick.x}" y1="{AXIS_HEIGHT - 6}" x2="{tick.x}" y2="{t.height}"/>'
            f'<text x="{tick.x}" y="{AXIS_HEIGHT - 10}" text-anchor="{anchor}">{escape(tick.label)}</text>'
        )
    parts.append("</g>")
    middle = (ROW_HEIGHT - BAR_HEIGHT) / 2
    for row in t.rows:
        classes = f"weft-step weft-kind-{_css(row.kind)} weft-status-{_css(row.status)}"
        if row.waiting:
            classes += " weft-wait"
        if row.open:
            classes += " weft-open"
        if row.attempt > 1:
            classes += " weft-retried"
        parts.append(
            f'<g class="{classes}" data-seq="{row.seq}" transform="translate(0 {row.y})">'
            f"<title>{escape(row.tooltip)}</title>"
            f'<text class="weft-label" x="4" y="{ROW_HEIGHT - 5}">{escape(row.label)}</text>'
        )
        if row.marker:
            parts.append(_diamond(row.x))
        else:
            parts.append(
                f'<rect class="weft-bar" x="{row.x}" y="{middle}" width="{row.width}" '
                f'height="{BAR_HEIGHT}" rx="2"/>'
            )
            if row.kind == "signal" and not row.open:
                # The wait ends where the signal arrived: mark that moment.
                parts.append(_diamond(row.x + row.width))
        if row.attempt > 1:
            text_x = min(row.x + max(row.width, 6) + 4, t.chart_right - 20)
            parts.append(
                f'<text class="weft-attempt" x="{text_x}" y="{ROW_HEIGHT - 5}">{TIMES}{row.attempt}</text>'
            )
        parts.append("</g>")
    parts.append("</svg>")
    # Every value that came from the history went through escape() above.
    return mark_safe("".join(parts))


def _diamond(cx: float, cy: float = ROW_HEIGHT / 2, r: float = BAR_HEIGHT / 2 + 1) -> str:
    """A marker for a moment: a small diamond centred on ``(cx, cy)``."""
    return f'<path class="weft-marker" d="M{cx} {cy - r} L{cx + r} {cy} L{cx} {cy + r} L{cx - r} {cy} Z"/>'


def _end_of(entry: TimelineEntry, now: datetime) -> datetime:
    return entry.finished_at if entry.finished_at is not None else max(now, entry.started_at)


def _label(entry: TimelineEntry) -> str:
    text = f"#{entry.seq} {entry.kind} {entry.name}"
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def _shown(moment: datetime, tz: tzinfo | None) -> datetime:
    return moment.astimezone(tz) if tz is not None and moment.tzinfo is not None else moment


def _tooltip(entry: TimelineEntry, now: datetime, tz: tzinfo | None) -> str:
    lines = [f"#{entry.seq} {entry.kind} {entry.name}", f"status: {entry.status}"]
    if entry.attempt > 1:
        lines.append(f"attempt: {entry.attempt}")
    lines.append(f"started: {_shown(entry.started_at, tz).isoformat()}")
    if entry.finished_at is not None:
        lines.append(f"finished: {_shown(entry.finished_at, tz).isoformat()}")
        lines.append(f"took: {format_duration(entry.finished_at - entry.started_at)}")
    else:
        lines.append(f"not finished, for {format_duration(now - entry.started_at)} so far")
    if entry.error:
        lines.append(f"error: {entry.error.get('type', '')}: {entry.error.get('message', '')}".rstrip(": "))
    return "\n".join(lines)


def _clock(start: datetime, span: float, i: int, tz: tzinfo | None) -> str:
    moment = _shown(start + timedelta(seconds=span * i / (TICKS - 1)), tz)
    if span < 10:
        return moment.strftime("%H:%M:%S.%f")[:-3]
    if span < 86400:
        return moment.strftime("%H:%M:%S")
    return moment.strftime("%Y-%m-%d %H:%M")


@lru_cache(maxsize=256)
def _css(value: str) -> str:
    """A status or kind as a CSS class part: only letters, digits, - and _."""
    return "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in value) or "none"


def format_duration(delta: timedelta) -> str:
    """A duration in the fewest words an operator needs: "350 ms", "4.2 s", "3 min 5 s"."""
    seconds = delta.total_seconds()
    if seconds < 0:
        seconds = 0.0
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s"
