"""Who may call which REST route, generated: every route and method of ``api/weft/``,
walked from the URL conf, by every principal of tests/support/permission_matrix.py, over
real HTTP (HTTP Basic), on the database under test.

What each route needs is read from the code, not typed here: the view's action and the
operation the API's permission tables (``RUN_ACTIONS`` / ``SCHEDULE_ACTIONS``) map it
to, whose permissions the operations catalogue names. The table below only says how
to call each route (the row it acts on, the body) and what it answers when allowed;
a route or method added without a row here fails :func:`test_every_route_has_a_row`.

A refused request answers 401 (anonymous) or 403 (authenticated) in the error envelope
and writes nothing (every django_weft table and the admin log compared before and after);
an allowed one answers the route's own success status, and a route that writes has
written. A session-authenticated write needs the CSRF token; with it, it passes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests
from django.contrib.auth import get_user_model
from django.urls import reverse
from rest_framework.permissions import IsAdminUser

from django_weft import client
from django_weft.api.permissions import ACTION_TABLES
from django_weft.api.views.common import WeftAPIView
from django_weft.engine.executor import TurnOutcome
from django_weft.models import WorkflowRun
from django_weft.testing import make_engine
from tests.support.driver import park
from tests.support.permission_matrix import (
    PASSWORD,
    PRINCIPALS,
    STAFF,
    Needs,
    Principal,
    changed_tables,
    needs,
    sanity,
    snapshot,
)
from tests.support.urlconf import patterns_under

from .conftest import Api

pytestmark = pytest.mark.django_db(transaction=True)

NAMESPACE = "django_weft_api"
PREFIX = "api/weft/"
METHODS = ("get", "post", "put", "patch", "delete")


# -- the walk -------------------------------------------------------------------------------


def _needs_of(view_class: type[Any], action: str) -> Needs:
    """What the view's own permission check asks for, read as the API reads it."""
    if issubclass(view_class, WeftAPIView):
        table = ACTION_TABLES[view_class.weft_resource]
        return needs(table[view_class.weft_action or action])
    if IsAdminUser in view_class.permission_classes:
        return STAFF
    raise AssertionError(f"{view_class.__name__}: a permission the matrix does not know")


def walked_routes() -> dict[tuple[str, str], Needs]:
    """Every (URL name, method) under ``api/weft/`` and what it needs."""
    found: dict[tuple[str, str], Needs] = {}
    for route, pattern in patterns_under(PREFIX):
        callback: Any = pattern.callback
        assert pattern.name, f"{route}: a route without a name"
        actions = getattr(callback, "actions", None)
        if actions is None:  # an APIView: its handlers are its methods
            actions = {method: method for method in METHODS if hasattr(callback.cls, method)}
        for method, action in actions.items():
            found[(pattern.name, method)] = _needs_of(callback.cls, action)
    return found


# -- the table ------------------------------------------------------------------------------


def _nothing(api: Api, token: str) -> dict[str, str]:
    return {}


def _cart(api: Api, token: str) -> dict[str, str]:
    """A run parked on its signal handlers, with query and update handlers."""
    run_id = client.start("tests.m.cart", kwargs={"key": token}, id=f"cart-{token}").run_id
    park(run_id)
    return {"ref": run_id}


def _suspended(api: Api, token: str) -> dict[str, str]:
    target = _cart(api, token)
    client.get_handle(target["ref"]).suspend()
    return target


def _failed(api: Api, token: str) -> dict[str, str]:
    run_id = client.start("tests.raises", id=f"raises-{token}").run_id
    assert make_engine().run_turn(run_id) == TurnOutcome.FAILED
    return {"ref": run_id}


def _pending_update(api: Api, token: str) -> dict[str, str]:
    target = _cart(api, token)
    sent = api.post(f"runs/{target['ref']}/update/", {"name": "close", "wait": 0, "update_id": token})
    assert sent.status_code == 202, sent.text
    return {**target, "update_id": token}


def _bulk_job(api: Api, token: str) -> dict[str, str]:
    started = api.post("runs/bulk/", {"action": "suspend", "filter": {"workflow": f"none-{token}"}})
    assert started.status_code == 202, started.text
    return {"job_id": started.json()["job"]["id"]}


def _schedule(api: Api, token: str, paused: bool = False) -> dict[str, str]:
    body = {"id": f"s-{token}", "workflow": "tests.echo", "every": "1h", "paused": paused}
    created = api.post("schedules/", body)
    assert created.status_code == 201, created.text
    return {"id": f"s-{token}"}


def _paused_schedule(api: Api, token: str) -> dict[str, str]:
    return _schedule(api, token, paused=True)


def _backfill_range(token: str) -> dict[str, str]:
    end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    return {"start": (end - timedelta(hours=2)).isoformat(), "end": end.isoformat()}


@dataclass(frozen=True)
class Call:
    """How to call a route, and what it answers when allowed."""

    target: Callable[[Api, str], dict[str, str]] = _nothing
    """Makes the row the call acts on, fresh for each principal: the URL's arguments."""
    body: Callable[[str], Any] | None = None
    """The JSON body, given the call's unique token."""
    query: str = ""
    allowed: int = 200
    writes: bool = False
    also: Needs | None = None
    """What the body asks for on top of the route (a bulk job's action)."""
    envelope: bool = True
    """A refusal comes in the JSON error envelope (the HTML pages answer in HTML)."""


CALLS: dict[tuple[str, str], Call] = {
    ("run-list", "get"): Call(),
    ("run-list", "post"): Call(body=lambda t: {"workflow": "tests.echo", "id": t}, allowed=201, writes=True),
    ("run-bulk", "post"): Call(
        body=lambda t: {"action": "suspend", "filter": {"status": ["waiting"]}},
        allowed=202,
        writes=True,
        also=needs("suspend"),
    ),
    ("run-bulk-job", "get"): Call(_bulk_job),
    ("run-detail", "get"): Call(_cart),
    ("run-history", "get"): Call(_cart),
    ("run-export", "get"): Call(_cart),
    ("run-result", "get"): Call(_cart, query="?wait=0", allowed=202),
    ("run-update-outcome", "get"): Call(_pending_update, query="?wait=0", allowed=202),
    ("run-query", "post"): Call(_cart, body=lambda t: {"name": "count"}),
    ("run-signal", "post"): Call(
        _cart, body=lambda t: {"name": "add", "payload": t}, allowed=202, writes=True
    ),
    ("run-send-update", "post"): Call(
        _cart, body=lambda t: {"name": "close", "wait": 0}, allowed=202, writes=True
    ),
    ("run-cancel", "post"): Call(_cart, body=lambda t: {"reason": "matrix"}, writes=True),
    ("run-suspend", "post"): Call(_cart, writes=True),
    ("run-resume", "post"): Call(_suspended, writes=True),
    ("run-retry", "post"): Call(_failed, writes=True),
    ("run-reset", "post"): Call(
        _cart, body=lambda t: {"to_seq": 0, "reason": "matrix"}, allowed=201, writes=True
    ),
    ("workflows", "get"): Call(),
    ("schedule-list", "get"): Call(),
    ("schedule-list", "post"): Call(
        body=lambda t: {"id": f"new-{t}", "workflow": "tests.echo", "every": "1h"}, allowed=201, writes=True
    ),
    ("schedule-detail", "get"): Call(_schedule),
    ("schedule-detail", "patch"): Call(_schedule, body=lambda t: {"note": "matrix"}, writes=True),
    ("schedule-detail", "delete"): Call(_schedule, allowed=204, writes=True),
    ("schedule-pause", "post"): Call(_schedule, body=lambda t: {"note": "matrix"}, writes=True),
    ("schedule-unpause", "post"): Call(_paused_schedule, writes=True),
    ("schedule-trigger", "post"): Call(_schedule, writes=True),
    ("schedule-backfill", "post"): Call(_schedule, body=_backfill_range, writes=True),
    ("schema", "get"): Call(query="?format=json"),
    ("schema-swagger", "get"): Call(envelope=False),
    ("schema-redoc", "get"): Call(envelope=False),
}

ROUTES = walked_routes()


def test_every_route_has_a_row() -> None:
    """A route or method added to the API needs its row in :data:`CALLS`."""
    assert set(ROUTES) == set(CALLS), {
        "walked, without a row": sorted(set(ROUTES) - set(CALLS)),
        "rows of no route": sorted(set(CALLS) - set(ROUTES)),
    }


def test_the_walk_reads_the_permission_tables() -> None:
    assert ROUTES[("run-reset", "post")].permissions == {"cancel_workflowrun", "add_workflowrun"}
    assert ROUTES[("schedule-detail", "delete")].permissions == {"delete_schedule"}
    assert ROUTES[("run-query", "post")].permissions == {"view_workflowrun"}
    assert ROUTES[("schema", "get")] == STAFF


VIEWING = frozenset({"view_workflowrun", "view_schedule"})
READING_POSTS = {("run-query", "post"), ("run-bulk", "post")}
"""A query only reads; a bulk job is checked again under its body's action."""


def test_a_write_needs_more_than_viewing() -> None:
    """Independent of the tables' contents: a GET needs at most a view permission, and any
    other method a permission beyond viewing (a write mapped to a view operation by
    mistake would pass the matrix, which reads the same table)."""
    for route, route_needs in ROUTES.items():
        if route_needs.staff_only:
            continue
        if route[1] == "get" or route in READING_POSTS:
            assert route_needs.permissions <= VIEWING, route
        else:
            assert route_needs.permissions - VIEWING, route


# -- the matrix -----------------------------------------------------------------------------


def _request(principal: Principal, method: str, url: str, body: Any) -> requests.Response:
    auth = (principal.name, PASSWORD) if principal.authenticated else None
    return requests.request(method, url, json=body, auth=auth, timeout=60)


def _url(api: Api, name: str, kwargs: dict[str, str], query: str) -> str:
    root = api.base[: -len(PREFIX) - 1]
    return root + reverse(f"{NAMESPACE}:{name}", kwargs=kwargs) + query


@pytest.mark.parametrize("route", sorted(CALLS), ids=lambda r: f"{r[1]}-{r[0]}")
def test_who_may_call_the_route(api: Api, route: tuple[str, str]) -> None:
    name, method = route
    call = CALLS[route]
    route_needs = ROUTES[route] + call.also if call.also else ROUTES[route]
    for index, principal in enumerate(PRINCIPALS):
        user = principal.make_user(route_needs)
        allowed = route_needs.allows(user)
        sanity(route_needs, principal, allowed)
        token = f"{index}-{principal.name}"
        target = call.target(api, token)
        url = _url(api, name, target, call.query)
        body = call.body(token) if call.body else None
        before = snapshot()
        response = _request(principal, method, url, body)
        after = snapshot()
        where = (principal.name, method, url, response.status_code, response.text[:300])
        if allowed:
            assert response.status_code == call.allowed, where
            if call.writes:
                assert changed_tables(before, after), ("allowed, but nothing was written", *where)
            else:
                assert not changed_tables(before, after), ("a read wrote", *where)
        else:
            expected = 401 if user is None else 403
            assert response.status_code == expected, where
            if call.envelope:
                code = "not_authenticated" if user is None else "permission_denied"
                assert response.json()["error"]["code"] == code, where
            assert not changed_tables(before, after), ("refused, but written", *where)


# -- CSRF with session authentication ---------------------------------------------------------


def _session_of(api: Api, username: str) -> requests.Session:
    """A browser-like session logged in through the admin's login form."""
    session = requests.Session()
    root = api.base[: -len(PREFIX) - 1]
    login = root + reverse("admin:login")
    session.get(login, timeout=60)
    answer = session.post(
        login,
        data={
            "username": username,
            "password": PASSWORD,
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
        headers={"Referer": login},
        timeout=60,
        allow_redirects=False,
    )
    assert answer.status_code == 302, answer.text[:300]
    return session


WRITES = sorted(route for route, call in CALLS.items() if route[1] != "get")


@pytest.mark.parametrize("route", WRITES, ids=lambda r: f"{r[1]}-{r[0]}")
def test_a_session_write_needs_the_csrf_token(api: Api, route: tuple[str, str]) -> None:
    """Signed in with a session (the admin's cookie), a write without ``X-CSRFToken`` is
    refused 403 and writes nothing; the same write with it passes."""
    get_user_model().objects.create_superuser("browser", password=PASSWORD)
    session = _session_of(api, "browser")
    name, method = route
    call = CALLS[route]
    for attempt, with_token in enumerate((False, True)):
        token = f"csrf-{attempt}"
        target = call.target(api, token)
        url = _url(api, name, target, call.query)
        headers = {"Referer": url}
        if with_token:
            headers["X-CSRFToken"] = session.cookies["csrftoken"]
        before = snapshot()
        response = session.request(
            method, url, json=call.body(token) if call.body else None, headers=headers, timeout=60
        )
        after = snapshot()
        if with_token:
            assert response.status_code == call.allowed, response.text[:300]
        else:
            assert response.status_code == 403, response.text[:300]
            assert "CSRF" in response.json()["error"]["message"], response.text[:300]
            assert not changed_tables(before, after)


def test_the_snapshot_sees_a_write(api: Api) -> None:
    """What "nothing written" rests on: a start changes the snapshot, in its table only."""
    before = snapshot()
    client.start("tests.echo", id="seen")
    assert changed_tables(before, snapshot()) == ["django_weft.WorkflowRun"]
    assert WorkflowRun.objects.filter(workflow_id="seen").exists()
