"""Every REST route with a path parameter, walked from the URL conf (a new route is covered
without editing this test), called with references no run, update, job or schedule can
have: a NUL (alone or inside), another control character, 10,000 characters, an emoji and
percent-encoded bytes that are not UTF-8. Each answer is a client error in the error
envelope, never a 500, on PostgreSQL (which refuses a NUL in a query) and SQLite, and
nothing is written."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from django_weft import WorkflowNotFound, client
from django_weft.models import Schedule, WorkflowRun
from tests.support.urlconf import routes_under

from .conftest import Api

BAD_VALUES = {
    "nul-inside": "a%00b",
    "nul-alone": "%00",
    "control": "a%01b",
    "very-long": "x" * 10_000,
    "emoji": "%F0%9F%98%80",
    "not-utf8": "%ED%A0%80",  # the encoding of a lone surrogate
}
METHODS = ("get", "post", "patch", "delete")
_PARAMETER = re.compile(r"\(\?P<(\w+)>[^)]*\)")


def _api_routes() -> Iterator[str]:
    """The API's routes with at least one path parameter, as regex text under api/weft/."""

    for route in routes_under("api/weft/"):
        if _PARAMETER.search(route):
            yield route[len("api/weft/") :]


def _path(route: str, value: str) -> str:
    return _PARAMETER.sub(value, route).replace("^", "").replace("$", "")


ROUTES = sorted(_api_routes())


def test_the_walk_finds_the_routes_with_parameters() -> None:
    assert "runs/(?P<ref>[^/]+)/history/$" in " ".join(ROUTES) or any("history" in r for r in ROUTES)
    assert len(ROUTES) >= 15


@pytest.mark.parametrize("route", ROUTES)
def test_a_reference_no_row_can_have_is_a_client_error(api: Api, route: str) -> None:
    counts = (WorkflowRun.objects.count(), Schedule.objects.count())
    for name, value in BAD_VALUES.items():
        path = _path(route, value)
        for method in METHODS:
            response = getattr(api, method)(path, **({"json": {}} if method in ("post", "patch") else {}))
            assert response.status_code < 500, (method, path[:80], name, response.text[:300])
            if response.status_code != 405 and response.headers.get("content-type", "").startswith(
                "application/json"
            ):
                assert "error" in response.json(), (method, name, response.text[:300])
    assert (WorkflowRun.objects.count(), Schedule.objects.count()) == counts


@pytest.mark.parametrize("ref", ["a\x00b", "\x00", "a\x01b", "x" * 10_000, "a\ud800b"])
@pytest.mark.django_db
def test_the_client_says_not_found_for_a_reference_no_run_can_have(ref: str) -> None:
    with pytest.raises(WorkflowNotFound):
        client.get_handle(ref).status()
