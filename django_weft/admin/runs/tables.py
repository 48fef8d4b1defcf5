"""The tables of a run's page, built as HTML here rather than in a template loop (a page of
200 steps with ten cells each costs a template engine ten times as long): its steps, and
its signals, updates and timers.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ... import runtime
from ...models import Timer
from ...models.messages import UpdateStatus
from .. import timeline
from ..common.display import json_block, shorten, zoned_moment

JSON_SHOWN = 2000
"""Characters of a signal's or update's JSON shown in its table; the rest is cut."""


STEP_COLUMNS = 9
"""Cells of a step's row (its details row spans them), without the reset column."""


def steps_rows(entries: list[runtime.HistoryEntry], *, reset_url: str | None = None) -> SafeString:
    """The steps table's rows: each step's row (position, kind, name, status, attempt,
    start, duration, a one-line outcome), then, when it has any, a row with its call,
    result and error as foldable JSON at the table's width and every attempt that failed
    before its last, each with its error and its traceback folded. With ``reset_url``
    (the run's reset page), each step's row ends with its "Reset to here" link."""
    return format_html_join(
        "\n", "{}{}", ((_step_row(entry, reset_url), _step_details(entry, reset_url)) for entry in entries)
    )


def _step_row(entry: runtime.HistoryEntry, reset_url: str | None) -> SafeString:
    took = (
        timeline.format_duration(entry.finished_at - entry.started_at)
        if entry.finished_at is not None
        else "not finished"
    )
    failed_before = len(entry.failed_attempts or [])
    attempt = (
        format_html('{} <span class="weft-error">({} failed)</span>', entry.attempt, failed_before)
        if failed_before
        else str(entry.attempt)
    )
    reset = (
        format_html(
            '<td><a href="{}?to_seq={}" class="weft-reset-link" title="A new run keeps the '
            'entries before #{} and runs this one again">Reset to here</a></td>',
            reset_url,
            entry.seq,
            entry.seq,
        )
        if reset_url
        else ""
    )
    return format_html(
        '<tr class="weft-step-row weft-step-{}" data-seq="{}"><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td>{}</tr>",
        entry.status,
        entry.seq,
        entry.seq,
        entry.kind,
        entry.name,
        entry.status,
        attempt,
        zoned_moment(entry.started_at),
        took,
        _outcome_line(entry),
        reset,
    )


def _outcome_line(entry: runtime.HistoryEntry) -> SafeString | str:
    """The step's outcome on one line: its error's type and message, or its result."""
    if entry.error:
        return format_html('<span class="weft-error">{}</span>', error_line(entry.error))
    if entry.result is not None:
        text = json.dumps(entry.result, ensure_ascii=False, sort_keys=True, default=str)
        return format_html('<code class="weft-oneline">{}</code>', shorten(text, ONE_LINE))
    return ""


ONE_LINE = 120
"""Characters of a step's result shown in its row (all of it is in its details)."""


def error_line(error: dict[str, Any]) -> str:
    """An error as "Type: message"."""
    kind, message = error.get("type"), error.get("message")
    return shorten(f"{kind or 'error'}: {message or ''}".rstrip(": "), 300)


def error_html(error: dict[str, Any], *, key: str) -> SafeString:
    """An error: its type and message, then its traceback folded."""
    trace = error.get("traceback")
    text = "".join(str(line) for line in trace) if isinstance(trace, list) else trace
    folded = (
        format_html(
            '<details class="weft-trace" data-key="{}"><summary>traceback</summary>'
            '<pre class="weft-traceback">{}</pre></details>',
            key,
            text,
        )
        if text
        else ""
    )
    return format_html('<span class="weft-error">{}</span>{}', error_line(error), folded)


def _step_details(entry: runtime.HistoryEntry, reset_url: str | None) -> SafeString | str:
    parts: list[SafeString] = []
    for number, failed in enumerate(entry.failed_attempts or [], start=1):
        parts.append(_failed_attempt(entry.seq, number, failed))
    if entry.error and entry.status != "retrying":  # a retrying step's error is its last failed attempt's
        parts.append(
            format_html(
                '<div class="weft-step-error"><strong>attempt {} failed:</strong> {}</div>',
                entry.attempt,
                error_html(entry.error, key=f"s{entry.seq}-trace"),
            )
        )
    if entry.args is not None:
        parts.append(json_block("call", entry.args, folded=True, key=f"s{entry.seq}-args"))
    if entry.result is not None:
        parts.append(json_block("result", entry.result, folded=True, key=f"s{entry.seq}-result"))
    if entry.error:
        parts.append(json_block("error as recorded", entry.error, folded=True, key=f"s{entry.seq}-error"))
    if not parts:
        return ""
    return format_html(
        '<tr class="weft-step-details" data-details-of="{}"><td></td><td colspan="{}">{}</td></tr>',
        entry.seq,
        STEP_COLUMNS - 1 + (1 if reset_url else 0),
        format_html_join("", "{}", ((part,) for part in parts)),
    )


def _failed_attempt(seq: int, number: int, failed: Any) -> SafeString:
    """One attempt that failed before the step's last (see ``StepRecord.failed_attempts``)."""
    failed = failed if isinstance(failed, dict) else {}
    error = failed.get("error") if isinstance(failed.get("error"), dict) else {}
    started, finished = _when(failed.get("started_at")), _when(failed.get("finished_at"))
    took = timeline.format_duration(finished - started) if started and finished else ""
    return format_html(
        '<div class="weft-failed-attempt" data-attempt="{}"><strong>attempt {} failed</strong> '
        '<span class="weft-quiet">{}{}</span>: {}</div>',
        failed.get("attempt", number),
        failed.get("attempt", number),
        zoned_moment(started) if started else "",
        f", after {took}" if took else "",
        error_html(error, key=f"s{seq}-a{number}-trace"),
    )


def _when(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


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
                zoned_moment(signal.received_at),
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
                zoned_moment(update.received_at),
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
                zoned_moment(timer.fire_at),
                zoned_moment(timer.fired_at) if timer.fired_at is not None else "not yet",
            )
            for timer in timers
        ),
    )


__all__ = [
    "JSON_SHOWN",
    "STEP_COLUMNS",
    "error_html",
    "error_line",
    "short_json",
    "signals_rows",
    "steps_rows",
    "timers_rows",
    "update_outcome",
    "updates_rows",
]
