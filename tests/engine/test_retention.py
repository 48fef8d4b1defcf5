"""Retention periods from WEFT_RETENTION and @workflow(retention=...), and the due ranges."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from django_weft import ConfigurationError, InvalidDuration
from django_weft.engine.records import RunStatus
from django_weft.engine.registry import registry, workflow
from django_weft.engine.retention import (
    DueRange,
    apply_override,
    due_ranges,
    parse_override,
    parse_retention,
)

DAY = 86400.0
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
ALL = ["completed", "failed", "cancelled", "timed_out", "continued"]


def days(n: float) -> datetime:
    return NOW - timedelta(days=n)


def test_a_duration_applies_to_every_terminal_status_and_none_keeps_forever() -> None:
    assert parse_retention("2d") == dict.fromkeys(ALL, 2 * DAY)
    assert parse_retention(timedelta(hours=1)) == dict.fromkeys(ALL, 3600.0)
    assert parse_retention(None) == dict.fromkeys(ALL)


def test_a_dict_names_statuses_and_the_rest_follow_its_default_or_30_days() -> None:
    assert parse_retention({"completed": "7d", "failed": "90d"}) == {
        "completed": 7 * DAY, "failed": 90 * DAY, "cancelled": 30 * DAY, "timed_out": 30 * DAY,
        "continued": 30 * DAY,
    }  # fmt: skip
    assert parse_retention({"failed": None, "default": "1d"}) == {
        "completed": DAY, "failed": None, "cancelled": DAY, "timed_out": DAY, "continued": DAY,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ({"running": "1d"}, ConfigurationError, "'running', which is not a terminal status (only finished"),
        (
            {"done": "1d"},
            ConfigurationError,
            "use completed, failed, cancelled, timed_out, continued or 'default'",
        ),
        ({"failed": "a while"}, InvalidDuration, "WEFT_RETENTION['failed'] 'a while' is not a duration"),
        ({"failed": -1}, InvalidDuration, "WEFT_RETENTION['failed'] must not be negative"),
        ("soon", InvalidDuration, "WEFT_RETENTION 'soon' is not a duration"),
        ([1, 2], ConfigurationError, "WEFT_RETENTION must be a duration (e.g. '30d'), None to keep"),
        (True, InvalidDuration, "WEFT_RETENTION must be seconds"),
    ],
)
def test_bad_values_say_what_to_fix(value: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as caught:
        parse_retention(value)
    assert message in str(caught.value)


def test_a_workflows_override_takes_its_statuses_then_its_default_then_the_settings() -> None:
    periods = parse_retention({"completed": "7d", "failed": "90d"})
    assert parse_override(None, what="w") == {}
    assert apply_override(periods, parse_override("1d", what="w")) == dict.fromkeys(ALL, DAY)
    assert apply_override(periods, parse_override({"completed": "1d"}, what="w")) == {
        **periods,
        "completed": DAY,
    }
    assert apply_override(periods, parse_override({"failed": None, "default": "2d"}, what="w")) == {
        "completed": 2 * DAY, "failed": None, "cancelled": 2 * DAY, "timed_out": 2 * DAY,
        "continued": 2 * DAY,
    }  # fmt: skip


def test_the_workflow_decorator_validates_and_keeps_its_retention() -> None:
    try:

        @workflow(name="tests.engine.kept_a_year", retention={"default": "365d", "failed": None})
        def kept(ctx: Any) -> None:
            pass

        assert kept.retention == {"default": 365 * DAY, "failed": None}
        with pytest.raises(
            ConfigurationError, match=r"the retention of workflow 'tests\.engine\.bad' has the key"
        ):
            workflow(name="tests.engine.bad", retention={"pending": "1d"})(lambda ctx: None)
        with pytest.raises(InvalidDuration, match=r"the retention of workflow 'tests\.engine\.bad'"):
            workflow(name="tests.engine.bad", retention="forever")(lambda ctx: None)
        assert "tests.engine.bad" not in registry.workflows
    finally:
        registry.unregister("tests.engine.kept_a_year")


def test_due_ranges_share_one_range_per_status_and_give_overridden_workflows_their_own() -> None:
    periods = parse_retention({"completed": "7d", "failed": "90d"})
    overrides = {
        "short": parse_override("1d", what="short"),
        "forever": parse_override({"default": None}, what="forever"),
        "same_failures": parse_override({"completed": "1d"}, what="same_failures"),
    }
    ranges = due_ranges(periods, overrides, NOW)
    assert ranges == [
        DueRange(RunStatus.COMPLETED, days(7), excluded=("forever", "same_failures", "short")),
        DueRange(RunStatus.COMPLETED, days(1), workflow="same_failures"),
        DueRange(RunStatus.COMPLETED, days(1), workflow="short"),
        # same_failures follows the setting for failed runs: the shared range covers it.
        DueRange(RunStatus.FAILED, days(90), excluded=("forever", "short")),
        DueRange(RunStatus.FAILED, days(1), workflow="short"),
        *[
            r
            for status in ("cancelled", "timed_out", "continued")
            for r in (
                DueRange(RunStatus(status), days(30), excluded=("forever", "short")),
                DueRange(RunStatus(status), days(1), workflow="short"),
            )
        ],
    ]


def test_with_retention_off_only_overridden_workflows_have_ranges() -> None:
    ranges = due_ranges(parse_retention(None), {"short": parse_override("1d", what="short")}, NOW)
    assert ranges == [DueRange(RunStatus(status), days(1), workflow="short") for status in ALL]
    assert due_ranges(parse_retention(None), {}, NOW) == []
