from __future__ import annotations

from datetime import timedelta

import pytest

from django_weft import InvalidDuration, parse_duration


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (5, 5.0), (1.5, 1.5), (timedelta(minutes=2), 120.0), ("30s", 30.0), ("1h", 3600.0),
        ("2d", 172800.0), ("100ms", 0.1), ("1h30m", 5400.0), ("1.5 hours", 5400.0),
        ("5 Minutes", 300.0), ("1w", 604800.0), ("90", 90.0), (" 10 s ", 10.0), (0, 0.0),
    ],
)  # fmt: skip
def test_accepted_forms(value: object, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "empty string"), ("soon", "not a duration"), ("5 parsecs", "unknown unit 'parsecs'"),
        ("1h 2x", "unknown unit 'x'"), ("h", "not a duration"), (-1, "must not be negative"),
        (timedelta(seconds=-3), "must not be negative"), (True, "must be seconds"), ([1], "must be seconds"),
        ("10s!", "not a duration"), ("1h" * 5000, "at most 100"), ("nan", "not NaN"),
        (float("nan"), "not NaN"), (float("inf"), "longer than 100 years"),
    ],
)  # fmt: skip
def test_rejected_forms_say_what_to_fix(value: object, fragment: str) -> None:
    with pytest.raises(InvalidDuration, match=fragment):
        parse_duration(value)  # type: ignore[arg-type]
