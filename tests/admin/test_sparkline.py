"""The dashboard's sparkline is a pure function: counts in, SVG out. No database."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET

from django_weft.admin.runs.sparkline import HEIGHT, PAD, WIDTH, render_sparkline

SVG = "{http://www.w3.org/2000/svg}"
BASELINE = HEIGHT - PAD


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def line_points(root: ET.Element) -> list[tuple[float, float]]:
    polyline = root.find(f"{SVG}polyline")
    assert polyline is not None
    return [(float(x), float(y)) for x, y in (pair.split(",") for pair in polyline.get("points", "").split())]


def slots(root: ET.Element) -> list[ET.Element]:
    return root.findall(f"{SVG}rect[@class='weft-spark-slot']")


def test_an_empty_hour_draws_the_frame_and_baseline_only() -> None:
    root = parse(render_sparkline([]))
    assert root.get("class") == "weft-sparkline"
    assert root.get("viewBox") == f"0 0 {WIDTH} {HEIGHT}"
    assert root.find(f"{SVG}line[@class='weft-spark-base']") is not None
    assert root.find(f"{SVG}polyline") is None
    assert root.find(f"{SVG}circle") is None
    assert slots(root) == []


def test_all_zero_is_a_flat_line_on_the_baseline_without_a_peak() -> None:
    root = parse(render_sparkline([0] * 60))
    points = line_points(root)
    assert len(points) == 60
    assert {y for _, y in points} == {float(BASELINE)}
    assert points[0][0] == PAD and points[-1][0] == WIDTH - PAD
    assert root.find(f"{SVG}circle") is None
    assert [slot.get("data-count") for slot in slots(root)] == ["0"] * 60


def test_one_spike_reaches_the_top_and_is_marked() -> None:
    counts = [0] * 60
    counts[42] = 17
    root = parse(render_sparkline(counts, labels=[f"m{i}" for i in range(60)]))
    points = line_points(root)
    assert points[42][1] == PAD  # the top of the drawing area
    assert all(y == BASELINE for index, (_, y) in enumerate(points) if index != 42)
    peak = root.find(f"{SVG}circle[@class='weft-spark-peak']")
    assert peak is not None and peak.get("data-index") == "42"
    assert float(peak.get("cx", "")) == points[42][0]
    slot = slots(root)[42]
    assert slot.get("data-count") == "17"
    title = slot.find(f"{SVG}title")
    assert title is not None and title.text == "m42: 17"


def test_heights_are_proportional_to_the_peak() -> None:
    points = line_points(parse(render_sparkline([2, 4, 1])))
    span = HEIGHT - 2 * PAD
    assert [round(BASELINE - y, 1) for _, y in points] == [span / 2, span, span / 4]


def test_the_slots_tile_the_width_without_overlapping() -> None:
    found = slots(parse(render_sparkline([1, 2, 3, 4])))
    edges = [
        (float(slot.get("x", "")), float(slot.get("x", "")) + float(slot.get("width", ""))) for slot in found
    ]
    assert edges[0][0] == 0 and abs(edges[-1][1] - WIDTH) < 0.1
    for (_, right), (left, _) in itertools.pairwise(edges):
        assert abs(right - left) < 0.1


def test_a_single_slot_is_centred_and_spans_the_width() -> None:
    root = parse(render_sparkline([3]))
    assert line_points(root) == [(WIDTH / 2, float(PAD))]
    (slot,) = slots(root)
    assert float(slot.get("x", "")) == 0 and float(slot.get("width", "")) == WIDTH


def test_labels_and_description_are_escaped() -> None:
    svg = render_sparkline([1], labels=["<b>&"], description='say "hi" <now>')
    root = parse(svg)  # still well-formed XML
    assert root.get("aria-label") == 'say "hi" <now>'
    title = slots(root)[0].find(f"{SVG}title")
    assert title is not None and title.text == "<b>&: 1"
    assert "<b>" not in svg


def test_negative_counts_are_drawn_as_zero() -> None:
    root = parse(render_sparkline([-5, 0]))
    assert {y for _, y in line_points(root)} == {float(BASELINE)}
