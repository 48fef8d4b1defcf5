"""Input no client should send and every surface must refuse clearly (or take as meant):
the tables the generated walks over the REST API and the management commands share."""

from __future__ import annotations

from typing import Any

ODD_TEXT: dict[str, str] = {
    "nul": "a\x00b",
    "nul-alone": "\x00",
    "control": "a\x01\x1f\x7fb",
    "lone-surrogate": "a\ud800b",
    "very-long": "x" * 10_000,
    "emoji": "\U0001f600",
    "sql": "x' OR '1'='1'; DROP TABLE django_weft_workflowrun; --",
    "like": "%_\\",
}
"""Text: control characters (a NUL alone and inside), a lone surrogate, 10,000 characters,
an emoji, SQL and LIKE metacharacters."""

ODD_NUMBERS: dict[str, Any] = {
    "past-64-bits": 2**64,
    "very-negative": -(2**63) - 1,
    "negative": -1,
    "float": 0.5,
}
"""Numbers past what a 64-bit column holds, negative ones and a fraction."""
