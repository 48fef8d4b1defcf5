"""The timeline renderer is a pure function: history entries in, SVG out. No database."""

from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django_weft.admin import timeline
from django_weft.runtime import HistoryEntry

T0 = datetime(2026, 12, 3, 14, 0, tzinfo=UTC)
SVG = "{http://www.w3.org/2000/svg}"


def entry(
    seq: int,
    kind: str = "activity",
    name: str = "tests.record",
    status: str = "completed",
    *,
    start: float = 0.0,
    took: float | None = 1.0,
    attempt: int = 1,
    error: dict[str, Any] | None = None,
) -> HistoryEntry:
    started = T0 + timedelta(seconds=start)
    return HistoryEntry(
        seq=seq,
        kind=kind,
        name=name,
        status=status,
        args=None,
        result=None,
        error=error,
        attempt=attempt,
        started_at=started,
        finished_at=None if took is None else started + timedelta(seconds=took),
    )


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    assert root.get("class") == "weft-timeline"
    return root


def steps_of(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if g.get("data-seq") is not None]


def test_one_step_is_one_element_with_its_seq_a_bar_and_a_tooltip() -> None:
    root = parse(timeline.render([entry(0)], now=T0 + timedelta(seconds=5)))
    (step,) = steps_of(root)
    assert step.get("data-seq") == "0"
    assert "weft-kind-activity" in step.get("class", "")
    assert "weft-status-completed" in step.get("class", "")
    title = step.find(f"{SVG}title")
    assert title is not None and "#0 activity tests.record" in (title.text or "")
    assert "took: 1.0 s" in (title.text or "")
    bar = step.find(f"{SVG}rect")
    assert bar is not None and float(bar.get("width", "0")) > 100  # the only step spans the axis


def test_no_history_is_an_empty_picture() -> None:
    root = parse(timeline.render([], now=T0))
    assert steps_of(root) == []


def test_a_thousand_steps_get_a_row_each_and_the_picture_grows_downwards() -> None:
    entries = [entry(i, start=i * 0.5, took=0.4) for i in range(1000)]
    layout = timeline.layout(entries, now=T0 + timedelta(hours=1))
    assert [row.seq for row in layout.rows] == list(range(1000))
    ys = [row.y for row in layout.rows]
    # One row per entry at a fixed height: labels never overlap.
    assert all(b - a == timeline.ROW_HEIGHT for a, b in itertools.pairwise(ys))
    assert layout.height >= 1000 * timeline.ROW_HEIGHT
    # Every bar stays within the chart, and later steps start further right.
    assert all(layout.chart_left <= row.x <= layout.chart_right for row in layout.rows)
    assert layout.rows[0].x < layout.rows[500].x < layout.rows[999].x
    root = parse(timeline.render_layout(layout))
    seqs = [g.get("data-seq") for g in steps_of(root)]
    assert seqs == [str(i) for i in range(1000)]
    assert len(root.findall(f".//{SVG}title")) == 1000


def test_retries_show_the_attempt_and_failures_their_error() -> None:
    error = {"type": "ConnectionError", "message": "mail server down"}
    svg = timeline.render(
        [entry(0, status="attempt_failed", attempt=2, error=error), entry(1, attempt=3, start=2)],
        now=T0 + timedelta(seconds=10),
    )
    first, second = steps_of(parse(svg))
    assert "weft-retried" in first.get("class", "") and "weft-status-attempt_failed" in first.get("class", "")
    assert "ConnectionError: mail server down" in (first.findtext(f"{SVG}title") or "")
    assert "attempt: 3" in (second.findtext(f"{SVG}title") or "")
    assert f"{timeline.TIMES}3" in "".join(second.itertext())


def test_waits_are_marked_as_waits_and_an_open_one_runs_to_now() -> None:
    now = T0 + timedelta(seconds=100)
    entries = [
        entry(0, took=1),
        entry(1, "sleep", "sleep", "completed", start=1, took=30),
        entry(2, "signal", "approve", "waiting", start=31, took=None),
    ]
    layout = timeline.layout(entries, now=now)
    sleep, waiting = layout.rows[1], layout.rows[2]
    assert sleep.waiting and not sleep.open
    assert waiting.waiting and waiting.open
    assert abs(waiting.x + waiting.width - layout.chart_right) < 1  # to now: the axis's end
    assert layout.end == now
    step = steps_of(parse(timeline.render_layout(layout)))[2]
    assert "weft-open" in step.get("class", "") and "weft-wait" in step.get("class", "")
    assert "not finished" in (step.findtext(f"{SVG}title") or "")


def test_handlers_are_markers_and_a_consumed_signal_marks_its_arrival() -> None:
    entries = [
        entry(0, "sleep", "sleep", start=0, took=10),
        entry(1, "handler", "signal:note", start=4, took=0),
        entry(2, "handler", "update:notes", start=6, took=0.01),
        entry(3, "signal", "approve", start=10, took=5),
    ]
    groups = steps_of(parse(timeline.render(entries, now=T0 + timedelta(seconds=20))))
    for handler in groups[1:3]:
        assert handler.find(f"{SVG}rect") is None
        assert handler.find(f"{SVG}path") is not None
    consumed = groups[3]
    assert consumed.find(f"{SVG}rect") is not None and consumed.find(f"{SVG}path") is not None


def test_names_are_escaped_and_labels_shortened() -> None:
    name = "<script>alert(1)</script>" + "x" * 80
    svg = timeline.render([entry(0, name=name)], now=T0)
    assert "<script>" not in svg
    step = steps_of(parse(svg))[0]
    label = step.findtext(f"{SVG}text") or ""
    assert len(label) <= timeline.LABEL_CHARS and label.endswith("…")
    assert name in (step.findtext(f"{SVG}title") or "")  # the tooltip has it whole


def test_axis_ticks_are_clock_times_over_the_history() -> None:
    svg = timeline.render([entry(0, took=3600)], now=T0)
    assert re.findall(r">(\d\d:\d\d:\d\d)<", svg)[0] == "14:00:00"
    assert "15:00:00" in svg


def test_times_are_shown_in_the_given_time_zone() -> None:
    oslo = ZoneInfo("Europe/Oslo")
    svg = timeline.render([entry(0, took=3600)], now=T0, tz=oslo)
    assert re.findall(r">(\d\d:\d\d:\d\d)<", svg)[0] == "15:00:00"
    assert "started: 2026-12-03T15:00:00+01:00" in svg


def test_durations_in_few_words() -> None:
    assert timeline.format_duration(timedelta(milliseconds=350)) == "350 ms"
    assert timeline.format_duration(timedelta(seconds=4.2)) == "4.2 s"
    assert timeline.format_duration(timedelta(seconds=185)) == "3 min 5 s"
    assert timeline.format_duration(timedelta(hours=2, minutes=4)) == "2 h 4 min"
    assert timeline.format_duration(timedelta(days=3, hours=4)) == "3 d 4 h"
    assert timeline.format_duration(timedelta(seconds=-1)) == "0 ms"
