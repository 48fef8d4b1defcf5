"""``Debounce``: its validation, its key, when a burst's run starts, and how its wait reads.
No database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from django_weft import ConfigurationError, Debounce, InvalidInput
from django_weft.engine.flow import debounced_reason
from django_weft.engine.registry import registry, workflow

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def test_the_public_surface_reads_as_documented() -> None:
    debounce = Debounce(period="30s", max_wait="5m", key=lambda index, **_: index)
    assert (debounce.period_seconds, debounce.max_wait_seconds) == (30.0, 300.0)
    assert debounce.key_of("search.reindex", ["products"], {}) == "products"
    assert Debounce(period=timedelta(seconds=2)).key_of("w", [1], {"a": 2}) == ""  # no key: one burst
    assert Debounce(period=1, max_wait=1).max_wait_seconds == 1.0  # max_wait may equal period


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"period": 0}, r"Debounce\(period=\.\.\.\) is how long a start waits .* longer than 0 seconds"),
        ({"period": "0s"}, r"must be longer than 0 seconds"),
        ({"period": -1}, r"Debounce\(period=\.\.\.\) must not be negative"),
        ({"period": "soon"}, r"Debounce\(period=\.\.\.\) 'soon' is not a duration"),
        ({"period": None}, r"Debounce\(period=\.\.\.\) must be seconds, a timedelta or a string"),
        ({"period": "30s", "max_wait": "10s"}, r"max_wait=\.\.\.\) .* at least its period \(30 s\), or None"),
        ({"period": "30s", "max_wait": "x"}, r"Debounce\(max_wait=\.\.\.\) 'x' is not a duration"),
        ({"period": "30s", "key": "index"}, r"Debounce\(key=\.\.\.\) takes a function .* got 'index'"),
    ],
)
def test_a_bad_declaration_is_a_configuration_error_saying_what_to_write(
    arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Debounce(**arguments)


def test_workflow_takes_only_a_debounce() -> None:
    with pytest.raises(
        ConfigurationError, match=r"debounce= takes django_weft.Debounce\(\.\.\.\); got '30s'"
    ):
        workflow(name="tests.engine.not_debounced", debounce="30s")(lambda ctx: None)
    assert "tests.engine.not_debounced" not in registry.workflows


@pytest.mark.parametrize(
    ("index", "error", "message"),
    [
        ("raise", InvalidInput, r"debounce key of workflow 'w' could not be computed .*: KeyError"),
        ("", InvalidInput, r"debounce key of workflow 'w' for these arguments is empty"),
        ("x" * 201, InvalidInput, r"is 201 characters \(at most 200\)"),
        (None, InvalidInput, r"debounce key function of workflow 'w' must return a str or int; it returned"),
    ],
)
def test_a_key_that_cannot_be_computed_refuses_the_start(index: Any, error: type, message: str) -> None:
    def key(index: Any) -> Any:
        if index == "raise":
            raise KeyError(index)
        return index

    with pytest.raises(error, match=message) as refused:
        Debounce(period=1, key=key).key_of("w", [index], {})
    assert refused.value.field == "args"


def test_a_burst_starts_a_period_after_its_last_start_and_no_later_than_max_wait_after_its_first() -> None:
    debounce = Debounce(period="30s", max_wait="5m")
    assert debounce.starts_at(T0, T0) == T0 + timedelta(seconds=30)
    assert debounce.starts_at(T0, T0 + timedelta(minutes=2)) == T0 + timedelta(minutes=2, seconds=30)
    assert debounce.starts_at(T0, T0 + timedelta(minutes=4, seconds=50)) == T0 + timedelta(minutes=5)
    assert Debounce(period="30s").starts_at(T0, T0 + timedelta(days=1)) == T0 + timedelta(days=1, seconds=30)


def test_the_wait_of_a_debounced_run_says_when_it_starts_and_how_many_starts_it_collapsed() -> None:
    reason = debounced_reason("products", T0 + timedelta(seconds=37), T0, 3)
    assert reason == {
        "kind": "debounce",
        "key": "products",
        "starts_at": "2026-12-03T09:00:37+00:00",
        "first_start_at": "2026-12-03T09:00:00+00:00",
        "starts": 3,
        "text": "debounced: starts at 09:00:37 (3 starts collapsed)",
    }
    assert debounced_reason("", T0, T0, 1)["text"] == "debounced: starts at 09:00:00 (1 start)"
