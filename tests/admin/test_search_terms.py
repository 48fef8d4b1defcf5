"""The changelist search box's text, parsed. No database."""

from __future__ import annotations

import uuid

import pytest

from django_weft.admin.runs.forms import RunSearch, SearchError, as_run_id, parse_run_search
from django_weft.engine.search_attributes import search_values


def test_ids_and_attributes() -> None:
    assert parse_run_search("  order-42   customer=7 tier=gold ") == RunSearch(
        ids=("order-42",), attributes=(("customer", "7"), ("tier", "gold"))
    )
    assert parse_run_search("") == RunSearch()


def test_values_stand_for_their_json_scalars_too() -> None:
    assert search_values("7") == ("7", 7)
    assert search_values("2.5") == ("2.5", 2.5)
    assert search_values("true") == ("true", True)
    assert search_values("null") == ("null", None)
    assert search_values('"7"') == ('"7"',)  # a JSON string stays the typed text
    assert search_values("[1]") == ("[1]",)
    # No JSON document holds these numbers: they are compared as text only.
    for raw in ("NaN", "Infinity", "-Infinity", "1e999", "9" * 30):
        assert search_values(raw) == (raw,)


@pytest.mark.parametrize(
    "term", ["=7", "1x=2", "a__gt=1", "status!=failed", "name\n=1", "x" * 101 + "=1", "a=\x00"]
)
def test_what_cannot_match_is_an_error(term: str) -> None:
    with pytest.raises(SearchError):
        parse_run_search(term)


def test_run_ids() -> None:
    run_id = uuid.uuid4()
    assert as_run_id(str(run_id)) == run_id
    assert as_run_id("order-42") is None
