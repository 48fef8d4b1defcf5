"""The tables of a run's page, built as HTML here rather than in a template loop (a page of
200 steps with ten cells each costs a template engine ten times as long): its steps, and
its signals, updates and timers.
"""

from __future__ import annotations

import json
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ... import runtime
from ...models import Timer
from ...models.messages import UpdateStatus
from .. import timeline
from ..common.display import moment, pretty_json

JSON_SHOWN = 2000
"""Characters of a signal's or update's JSON shown in its table; the rest is cut."""


def steps_rows(entries: list[runtime.HistoryEntry], *, reset_url: str | None = None) -> SafeString:
    """The steps table's rows (built here rather than in a template loop: a page of 200
    steps with ten cells each costs a template engine ten times as long). With
    ``reset_url`` (the run's reset page), each row ends with its "Reset to here" link."""
    rows = format_html_join(
        "\n",
        '<tr class="weft-step-row" data-seq="{}"><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{}</tr>",
        (
            (
                entry.seq,
                entry.seq,
                entry.kind,
                entry.name,
                entry.status,
                entry.attempt,
                moment(entry.started_at),
                timeline.format_duration(entry.finished_at - entry.started_at)
                if entry.finished_at is not None
                else "not finished",
                pretty_json(entry.args) if entry.args is not None else "",
                pretty_json(entry.result) if entry.result is not None else "",
                pretty_json(entry.error) if entry.error else "",
                format_html(
                    '<td><a href="{}?to_seq={}" class="weft-reset-link" title="A new run keeps the '
                    'entries before #{} and runs this one again">Reset to here</a></td>',
                    reset_url,
                    entry.seq,
                    entry.seq,
                )
                if reset_url
                else "",
            )
            for entry in entries
        ),
    )
    return rows


# -- the signals, updates and timers tables ---------------------------------------------


def short_json(value: Any) -> SafeString:
    """A JSON value indented in a ``<pre>``, cut after :data:`JSON_SHOWN` characters (a
    page of 50 payloads of up to ``WEFT_MAX_PAYLOAD_BYTES`` each would not be readable)."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    if len(text) > JSON_SHOWN:
        text = f"{text[:JSON_SHOWN]}\n… ({len(text):,} characters in all)"
    return format_html('<pre class="weft-json">{}</pre>', text)


def signals_rows(signals: list[runtime.SignalRecord]) -> SafeString:
    return format_html_join(
        "\n",
        '<tr class="weft-signal-row" data-sequence="{}"><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
        "<td>{}</td><td>{}</td></tr>",
        (
            (
                signal.sequence,
                signal.sequence,
                signal.name,
                signal.signal_id or "-",
                moment(signal.received_at),
                f"by step #{signal.consumed_seq}" if signal.consumed_seq is not None else "no, buffered",
                short_json(signal.payload),
            )
            for signal in signals
        ),
    )


def update_outcome(update: runtime.UpdateRecord) -> SafeString | str:
    """What the run answered: the handler's result, its error, or that it has not yet."""
    if update.status == UpdateStatus.COMPLETED:
        return short_json(update.result)
    if update.error:
        kind, message = update.error.get("type"), update.error.get("message")
        return format_html('<span class="weft-error">{}: {}</span>', kind or "error", message or "")
    return "not applied yet"


def updates_rows(updates: list[runtime.UpdateRecord]) -> SafeString:
    return format_html_join(
        "\n",
        '<tr class="weft-update-row" data-update-id="{}"><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
        "<td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (
                update.update_id,
                update.update_id,
                update.name,
                update.status,
                moment(update.received_at),
                f"#{update.applied_seq}" if update.applied_seq is not None else "-",
                short_json(update.payload),
                update_outcome(update),
            )
            for update in updates
        ),
    )


def timers_rows(timers: list[runtime.TimerRecord]) -> SafeString:
    return format_html_join(
        "\n",
        '<tr class="weft-timer-row"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
        (
            (
                Timer.Kind(timer.kind).label if timer.kind in Timer.Kind.values else timer.kind,
                f"step #{timer.seq}" if timer.seq >= 0 else "the run",
                moment(timer.fire_at),
                moment(timer.fired_at) if timer.fired_at is not None else "not yet",
            )
            for timer in timers
        ),
    )


__all__ = [
    "JSON_SHOWN",
    "short_json",
    "signals_rows",
    "steps_rows",
    "timers_rows",
    "update_outcome",
    "updates_rows",
]
