"""``WorkflowRun.objects.search_attribute(name, raw)``: a searched text matched as every
value it may stand for, on PostgreSQL (JSON containment) and SQLite (key by key)."""

from __future__ import annotations

from typing import Any

import pytest

from django_weft import client
from django_weft.engine.errors import InvalidInput
from django_weft.engine.search_attributes import search_values
from django_weft.models import WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

BIG = str(2**63)


@pytest.fixture
def runs() -> dict[str, str]:
    attributes: dict[str, dict[str, Any]] = {
        "int": {"customer": 7, "score": 2, "vip": False},
        "int-text": {"customer": "7", "score": "2.5"},
        "float": {"score": 2.5, "vip": True},
        "bool-text": {"vip": "true", "tier": "gold"},
        "big-text": {"customer": BIG, "tier": "Gold"},
        "largest": {"customer": 2**63 - 1},
        "none": {},
    }
    return {
        name: client.start("tests.echo", id=f"sa-{name}", search_attributes=values).run_id
        for name, values in attributes.items()
    }


def found(runs: dict[str, str], name: str, raw: str) -> set[str]:
    by_id = {run_id: key for key, run_id in runs.items()}
    return {
        by_id[str(pk)] for pk in WorkflowRun.objects.search_attribute(name, raw).values_list("pk", flat=True)
    }


def test_an_integer_text_finds_the_number_and_the_text(runs: dict[str, str]) -> None:
    assert found(runs, "customer", "7") == {"int", "int-text"}
    assert found(runs, "customer", str(2**63 - 1)) == {"largest"}


def test_a_float_text_finds_the_number_and_the_text(runs: dict[str, str]) -> None:
    assert found(runs, "score", "2.5") == {"float", "int-text"}
    assert found(runs, "score", "2") == {"int"}


def test_a_boolean_text_finds_the_boolean_and_the_text(runs: dict[str, str]) -> None:
    assert found(runs, "vip", "true") == {"float", "bool-text"}
    assert found(runs, "vip", "false") == {"int"}


def test_a_string_is_matched_exactly(runs: dict[str, str]) -> None:
    assert found(runs, "tier", "gold") == {"bool-text"}
    assert found(runs, "tier", "silver") == set()
    assert found(runs, "nowhere", "7") == set()


def test_an_integer_past_64_bits_is_searched_as_text_only(runs: dict[str, str]) -> None:
    assert search_values(BIG) == (BIG,)
    assert search_values(str(-(2**63))) == (str(-(2**63)),)
    assert search_values(str(2**63 - 1)) == (str(2**63 - 1), 2**63 - 1)
    assert search_values("1e999") == ("1e999",)
    assert found(runs, "customer", BIG) == {"big-text"}
    assert found(runs, "customer", str(-(2**63) - 5)) == set()


@pytest.mark.parametrize("name", ["a__b", "1st", "bad name", "", "x" * 101, "a=b"])
def test_a_name_that_is_not_an_attribute_name_is_refused(name: str) -> None:
    with pytest.raises(InvalidInput, match="A search attribute name is letters") as caught:
        WorkflowRun.objects.search_attribute(name, "7")
    assert getattr(caught.value, "field", None) == "name"


def test_a_value_with_a_nul_character_is_refused() -> None:
    with pytest.raises(InvalidInput, match="NUL character") as caught:
        WorkflowRun.objects.search_attribute("customer", "a\x00b")
    assert getattr(caught.value, "field", None) == "value"
