"""Every admin URL of django_weft's models that takes an object id, walked from the URL
conf (a new view is covered without editing this test), opened and posted by a superuser
with ids no row can have: a NUL (alone or inside), another control character, 10,000
characters, an emoji. Each answer is a page, a redirect with a message or a 404, never a
500, on PostgreSQL (which refuses a NUL in a query) and SQLite, and nothing is written."""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from django.test import Client

from django_weft.models import Schedule, WorkflowRun
from tests.support.urlconf import routes_under

BAD_IDS = {
    "nul-inside": "a\x00b",
    "nul-alone": "\x00",
    "control": "a\x01b",
    "long": "x" * 10_000,
    "emoji": "\U0001f600",
}
_PARAMETER = re.compile(r"<(?:\w+:)?(\w+)>|\(\?P<(\w+)>[^)]*\)")


def _admin_routes() -> Iterator[str]:
    for route in routes_under("admin/django_weft/"):
        if _PARAMETER.search(route):
            yield route


ROUTES = sorted(set(_admin_routes()))


def _path(route: str, value: str) -> str:
    return "/" + _PARAMETER.sub(quote(value, safe=""), route).replace("^", "").replace("$", "")


def test_the_walk_finds_the_object_views() -> None:
    assert any("workflowrun" in route and "change" in route for route in ROUTES)
    assert any("schedule" in route and "backfill" in route for route in ROUTES)


@pytest.mark.parametrize("route", ROUTES)
def test_an_id_no_row_can_have_is_never_a_server_error(admin_client_: Client, route: str) -> None:
    counts = (WorkflowRun.objects.count(), Schedule.objects.count())
    for name, value in BAD_IDS.items():
        path = _path(route, value)
        for method in ("get", "post"):
            response = getattr(admin_client_, method)(path)
            assert response.status_code < 500, (method, route, name)
    assert (WorkflowRun.objects.count(), Schedule.objects.count()) == counts
