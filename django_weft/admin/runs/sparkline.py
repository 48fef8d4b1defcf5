"""The dashboard's sparkline: counts per minute in, an inline SVG out.

Pure: no database, no request, no Django beyond HTML escaping. A line over the counts
(with a light area under it) on a fixed-size canvas, the peak marked, and per count one
invisible ``<rect class="weft-spark-slot" data-index="i" data-count="n">`` with a
``<title>`` tooltip, so hovering any minute says how many runs finished in it. Colours
come from CSS classes, so the admin's stylesheet, light or dark, decides them; there is
no JavaScript.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

WIDTH = 600
HEIGHT = 64
PAD = 4
"""Room around the line, so the peak marker is not cut off at the edge."""


def render_sparkline(
    counts: Sequence[int],
    *,
    labels: Sequence[str] = (),
    width: int = WIDTH,
    height: int = HEIGHT,
    description: str = "",
) -> SafeString:
    """``counts`` (one per slot, oldest first) as ``<svg class="weft-sparkline">``.

    ``labels`` name the slots in the tooltips ("14:03: 12"); missing labels fall back to
    the slot's position. ``description`` becomes the picture's accessible name. An empty
    ``counts`` gives the frame with the baseline only; all zeros give a flat line on it.
    """
    counts = [max(int(count), 0) for count in counts]
    peak = max(counts, default=0)
    baseline = height - PAD
    span = height - 2 * PAD
    step = (width - 2 * PAD) / (len(counts) - 1) if len(counts) > 1 else 0.0

    def x_of(index: int) -> float:
        return PAD + index * step if len(counts) > 1 else width / 2

    def y_of(count: int) -> float:
        return baseline - (count / peak) * span if peak else float(baseline)

    points = [(x_of(index), y_of(count)) for index, count in enumerate(counts)]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    parts = [
        format_html(
            '<line class="weft-spark-base" x1="{}" y1="{}" x2="{}" y2="{}"></line>',
            PAD,
            baseline,
            width - PAD,
            baseline,
        )
    ]
    if points:
        first_x, last_x = points[0][0], points[-1][0]
        parts.append(
            format_html(
                '<path class="weft-spark-area" d="{}"></path>',
                f"M{first_x:.1f},{baseline} L{line.replace(' ', ' L')} L{last_x:.1f},{baseline} Z",
            )
        )
        parts.append(format_html('<polyline class="weft-spark-line" points="{}"></polyline>', line))
    if peak:
        top = counts.index(peak)
        parts.append(
            format_html(
                '<circle class="weft-spark-peak" data-index="{}" cx="{}" cy="{}" r="2.5"></circle>',
                top,
                f"{points[top][0]:.1f}",
                f"{points[top][1]:.1f}",
            )
        )
    # Each slot's hover area reaches halfway to its neighbours (the whole width for one).
    half = step / 2 if len(counts) > 1 else width / 2
    slots = []
    for index, (count, (x, _)) in enumerate(zip(counts, points, strict=True)):
        left, right = max(x - half, 0.0), min(x + half, float(width))
        label = labels[index] if index < len(labels) else f"#{index + 1}"
        slots.append((index, count, f"{left:.1f}", f"{right - left:.1f}", height, label, count))
    parts.append(
        format_html_join(
            "",
            '<rect class="weft-spark-slot" data-index="{}" data-count="{}" x="{}" y="0" '
            'width="{}" height="{}"><title>{}: {}</title></rect>',
            slots,
        )
    )
    return format_html(
        '<svg class="weft-sparkline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" '
        'width="{w}" height="{h}" role="img" aria-label="{label}">'
        "{body}</svg>",
        w=width,
        h=height,
        label=description or f"{sum(counts)} in {len(counts)} slots, at most {peak} in one",
        body=format_html_join("", "{}", ((part,) for part in parts)),
    )
