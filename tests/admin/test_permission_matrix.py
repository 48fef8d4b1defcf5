"""Who may use which admin screen of django_weft, generated: every URL of the run and
schedule admins (walked from the URL conf: changelists, object pages, history, delete,
the tools, reset, backfill, the dashboard) and every action posted to a changelist (its
confirmation page and its confirmed request), by every principal of
tests/support/permission_matrix.py.

Each screen names the catalogue's operation it performs (``Needs``); whether a principal
passes is derived from ``Operation.allowed``. A screen or action added without a row here
fails :func:`test_every_admin_url_and_action_has_a_row`.

Refused: the login page for anonymous and non-staff users, 403 for staff, and nothing
written (every django_weft table and the admin log compared). Allowed: the screen's own
answer (a page, or the redirect after the change), and a change has been written. With
``Client(enforce_csrf_checks=True)``, every POST without the CSRF token is refused 403
and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from django_weft import client
from django_weft.engine.executor import TurnOutcome
from django_weft.testing import make_engine
from tests.support.driver import park
from tests.support.permission_matrix import (
    NOBODY,
    PASSWORD,
    PRINCIPALS,
    STAFF,
    Needs,
    changed_tables,
    needs,
    sanity,
    snapshot,
)
from tests.support.urlconf import routes_under

pytestmark = pytest.mark.django_db

PREFIX = "admin/django_weft/"
LOGIN = "/admin/login/"


# -- the walk -------------------------------------------------------------------------------


def walked_urls() -> set[str]:
    """The admin URLs of django_weft's models, as patterns under ``admin/django_weft/``."""
    return {route[len(PREFIX) :] for route in routes_under(PREFIX)}


def walked_actions() -> set[str]:
    """The changelist actions each django_weft model admin declares."""
    return {
        f"{model._meta.model_name}:{getattr(action, '__name__', action)}"
        for model, model_admin in admin.site._registry.items()
        if model._meta.app_label == "django_weft"
        for action in model_admin.actions or ()
    }


# -- the rows it acts on --------------------------------------------------------------------


def _cart(token: str) -> str:
    run_id = client.start("tests.m.cart", kwargs={"key": token}, id=f"cart-{token}").run_id
    park(run_id)
    return run_id


def _suspended(token: str) -> str:
    run_id = _cart(token)
    client.get_handle(run_id).suspend()
    return run_id


def _failed(token: str) -> str:
    run_id = client.start("tests.raises", id=f"raises-{token}").run_id
    assert make_engine().run_turn(run_id) == TurnOutcome.FAILED
    return run_id


def _schedule(token: str) -> str:
    return client.create_schedule(f"s-{token}", "tests.echo", every="1h").id


def _paused_schedule(token: str) -> str:
    schedule_id = _schedule(token)
    client.get_schedule_handle(schedule_id).pause()
    return schedule_id


def _none(token: str) -> str:
    return ""


SCHEDULE_FORM = {
    "workflow": "tests.echo",
    "args": "[]",
    "kwargs": "{}",
    "search_attributes": "{}",
    "cron": "",
    "every": "2h",
    "offset": "",
    "timezone": "UTC",
    "start_at_0": "",
    "start_at_1": "",
    "end_at_0": "",
    "end_at_1": "",
    "jitter": "",
    "overlap": "skip",
    "catchup_window": "1m",
    "note": "matrix",
}


def _backfill_form(token: str) -> dict[str, str]:
    end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(hours=2)
    return {
        "start_0": start.strftime("%Y-%m-%d"),
        "start_1": start.strftime("%H:%M"),
        "end_0": end.strftime("%Y-%m-%d"),
        "end_1": end.strftime("%H:%M"),
        "overlap": "allow_all",
    }


# -- the table ------------------------------------------------------------------------------


def viewing(model: str, *ops: str) -> Needs:
    """Viewing ``model``'s screens (and performing ``ops`` there). The admin shows an
    object to whoever may change it too, as Django's admin does: runs cannot be changed
    here, so only viewing them counts; a schedule may be viewed or changed."""
    if model == "run":
        return needs("view", *ops)
    return Needs(ops=("view_schedule", *ops), or_ops=("change_schedule", *ops))


@dataclass(frozen=True)
class Visit:
    """One request to an admin URL: how, on which row, and its answer when allowed."""

    needs: Needs
    method: str = "get"
    target: Callable[[str], str] = _none
    """Makes the row (fresh for each principal); its id fills ``<path:object_id>``."""
    data: Callable[[str], dict[str, Any]] | None = None
    query: str = ""
    allowed: int = 200
    writes: bool = False


def _start_form(token: str) -> dict[str, str]:
    return {
        "workflow": "tests.echo",
        "args": "[]",
        "kwargs": "{}",
        "workflow_id": f"started-{token}",
        "on_conflict": "fail",
        "execution_timeout": "",
        "start_delay": "",
        "search_attributes": "{}",
    }


VISITS: dict[str, list[Visit]] = {
    # -- runs
    "workflowrun/": [Visit(viewing("run"))],
    "workflowrun/add/": [Visit(NOBODY), Visit(NOBODY, "post", data=lambda t: {"workflow_id": t})],
    "workflowrun/<path:object_id>/change/": [
        Visit(viewing("run"), target=_cart),
        Visit(NOBODY, "post", target=_cart, data=lambda t: {"workflow_id": "changed", "status": "completed"}),
    ],
    "workflowrun/<path:object_id>/delete/": [
        Visit(NOBODY, target=_cart),
        Visit(NOBODY, "post", target=_cart, data=lambda t: {"post": "yes"}),
    ],
    "workflowrun/<path:object_id>/history/": [Visit(viewing("run"), target=_cart)],
    "workflowrun/<path:object_id>/": [Visit(STAFF, target=_cart, allowed=302)],
    "workflowrun/dashboard/": [Visit(viewing("run"))],
    "workflowrun/start/": [
        Visit(needs("start")),
        Visit(needs("start"), "post", data=_start_form, allowed=302, writes=True),
    ],
    "workflowrun/<path:object_id>/signal/": [
        Visit(needs("signal"), target=_cart),
        Visit(
            needs("signal"),
            "post",
            _cart,
            lambda t: {"name": "add", "payload": "1"},
            allowed=302,
            writes=True,
        ),
    ],
    "workflowrun/<path:object_id>/update/": [
        Visit(needs("update"), target=_cart),
        Visit(
            needs("update"),
            "post",
            _cart,
            lambda t: {"name": "close", "payload": "null", "wait": "0"},
            writes=True,
        ),
    ],
    "workflowrun/<path:object_id>/query/": [
        Visit(needs("query"), target=_cart),
        Visit(needs("query"), "post", _cart, lambda t: {"name": "count", "args": "[]"}),
    ],
    "workflowrun/<path:object_id>/reset/": [
        Visit(needs("reset"), target=_cart, query="?to_seq=0"),
        Visit(
            needs("reset"),
            "post",
            _cart,
            lambda t: {"to_seq": "0", "reason": "matrix"},
            allowed=302,
            writes=True,
        ),
    ],
    # -- schedules
    "schedule/": [Visit(viewing("schedule"))],
    "schedule/add/": [
        Visit(needs("create_schedule")),
        Visit(
            needs("create_schedule"),
            "post",
            data=lambda t: {**SCHEDULE_FORM, "id": f"new-{t}"},
            allowed=302,
            writes=True,
        ),
    ],
    "schedule/<path:object_id>/change/": [
        Visit(viewing("schedule"), target=_schedule),
        Visit(needs("change_schedule"), "post", _schedule, lambda t: SCHEDULE_FORM, allowed=302, writes=True),
    ],
    "schedule/<path:object_id>/delete/": [
        Visit(needs("delete_schedule"), target=_schedule),
        Visit(
            needs("delete_schedule"), "post", _schedule, lambda t: {"post": "yes"}, allowed=302, writes=True
        ),
    ],
    "schedule/<path:object_id>/history/": [Visit(viewing("schedule"), target=_schedule)],
    "schedule/<path:object_id>/": [Visit(STAFF, target=_schedule, allowed=302)],
    "schedule/<path:object_id>/backfill/": [
        Visit(needs("backfill"), target=_schedule),
        Visit(needs("backfill"), "post", _schedule, _backfill_form, writes=True),
    ],
}

# Each action: the operation it applies (on top of viewing the list), the row it takes,
# and the options its confirmation asks for.
ACTIONS: dict[str, tuple[Needs, Callable[[str], str], dict[str, str]]] = {
    "workflowrun:cancel_runs": (
        viewing("run", "cancel", "retry"),
        _cart,
        {"mode": "terminate", "reason": "m"},
    ),
    "workflowrun:suspend_runs": (viewing("run", "suspend", "resume"), _cart, {}),
    "workflowrun:resume_runs": (viewing("run", "suspend", "resume"), _suspended, {}),
    "workflowrun:retry_runs": (viewing("run", "cancel", "retry"), _failed, {}),
    "schedule:pause_schedules": (viewing("schedule", "pause", "unpause"), _schedule, {"note": "m"}),
    "schedule:unpause_schedules": (viewing("schedule", "pause", "unpause"), _paused_schedule, {}),
    "schedule:trigger_schedules": (
        viewing("schedule", "trigger", "backfill"),
        _schedule,
        {"overlap": "skip"},
    ),
    "schedule:delete_schedules": (viewing("schedule", "delete_schedule"), _schedule, {}),
}


def test_every_admin_url_and_action_has_a_row() -> None:
    """An admin URL or action added to django_weft needs its row in :data:`VISITS` or :data:`ACTIONS`."""
    assert walked_urls() == set(VISITS), {
        "walked, without a row": sorted(walked_urls() - set(VISITS)),
        "rows of no URL": sorted(set(VISITS) - walked_urls()),
    }
    assert walked_actions() == set(ACTIONS)


# -- the matrix -----------------------------------------------------------------------------


def _url(route: str, object_id: str, query: str = "") -> str:
    return "/" + PREFIX + route.replace("<path:object_id>", object_id) + query


def _client_of(user: Any, *, csrf: bool = False) -> Client:
    browser = Client(enforce_csrf_checks=csrf)
    if user is not None:
        browser.force_login(user)
    return browser


def _check(
    response: Any, allowed: bool, user: Any, writes: bool, before: Any, after: Any, where: Any, status: int
) -> None:
    location = response.get("Location", "")
    if allowed:
        assert response.status_code == status, where
        assert not location.startswith(LOGIN), where
        if writes:
            assert changed_tables(before, after), ("allowed, but nothing was written", *where)
        else:
            assert not changed_tables(before, after), (
                "no change expected",
                changed_tables(before, after),
                *where,
            )
        return
    if user is None or not user.is_staff:
        assert response.status_code == 302 and location.startswith(LOGIN), where
    else:
        assert response.status_code == 403, where
    assert not changed_tables(before, after), ("refused, but written", changed_tables(before, after), *where)


URLS = sorted((route, index) for route, visits in VISITS.items() for index in range(len(visits)))


@pytest.mark.parametrize(("route", "index"), URLS, ids=[f"{VISITS[r][i].method}-{r}" for r, i in URLS])
def test_who_may_use_the_screen(route: str, index: int) -> None:
    visit = VISITS[route][index]
    for number, principal in enumerate(PRINCIPALS):
        user = principal.make_user(visit.needs)
        allowed = visit.needs.allows(user)
        sanity(visit.needs, principal, allowed)
        token = f"{number}-{principal.name}"
        url = _url(route, visit.target(token), visit.query)
        browser = _client_of(user)
        before = snapshot()
        if visit.method == "post":
            response = browser.post(url, visit.data(token) if visit.data else {})
        else:
            response = browser.get(url)
        after = snapshot()
        where = (principal.name, visit.method, url, response.status_code)
        _check(response, allowed, user, visit.writes, before, after, where, visit.allowed)


def _changelist(action: str) -> str:
    model = action.split(":")[0]
    return reverse(f"admin:django_weft_{model}_changelist")


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_who_may_take_the_action(action: str) -> None:
    """The confirmation page, then the confirmed request, by each principal."""
    action_needs, target, options = ACTIONS[action]
    name = action.split(":")[1]
    for number, principal in enumerate(PRINCIPALS):
        user = principal.make_user(action_needs)
        allowed = action_needs.allows(user)
        sanity(action_needs, principal, allowed)
        row = target(f"{number}-{principal.name}")
        browser = _client_of(user)
        chosen = {"action": name, "_selected_action": [row]}
        for step, data, status, writes in (
            ("page", chosen, 200, False),
            ("confirmed", {**chosen, **options, "post": "yes"}, 302, True),
        ):
            before = snapshot()
            response = browser.post(_changelist(action), data)
            after = snapshot()
            where = (principal.name, action, step, response.status_code)
            _check(response, allowed, user, writes, before, after, where, status)


# -- CSRF -------------------------------------------------------------------------------------


def _posts() -> Iterator[tuple[str, Visit]]:
    for route, visits in VISITS.items():
        for visit in visits:
            if visit.method == "post" and not visit.needs.nobody:
                yield route, visit


@pytest.mark.parametrize(("route", "visit"), list(_posts()), ids=[route for route, _ in _posts()])
def test_an_admin_post_without_the_csrf_token_is_refused(route: str, visit: Visit) -> None:
    root = get_user_model().objects.create_superuser("root", password=PASSWORD)
    url = _url(route, visit.target("csrf"), visit.query)
    data = visit.data("csrf") if visit.data else {}
    before = snapshot()
    refused = _client_of(root, csrf=True).post(url, data)
    assert refused.status_code == 403 and b"CSRF" in refused.content, (url, refused.status_code)
    assert not changed_tables(before, snapshot())
    # The same request with the token passes.
    browser = _client_of(root, csrf=True)
    page = browser.get(url)
    assert page.status_code == 200, (url, page.status_code)
    token = browser.cookies["csrftoken"].value
    passed = browser.post(url, {**data, "csrfmiddlewaretoken": token})
    assert passed.status_code == visit.allowed, (url, passed.status_code)


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_an_action_without_the_csrf_token_is_refused(action: str) -> None:
    root = get_user_model().objects.create_superuser("root", password=PASSWORD)
    _, target, options = ACTIONS[action]
    row = target("csrf")
    data = {"action": action.split(":")[1], "_selected_action": [row], **options, "post": "yes"}
    before = snapshot()
    refused = _client_of(root, csrf=True).post(_changelist(action), data)
    assert refused.status_code == 403 and b"CSRF" in refused.content
    assert not changed_tables(before, snapshot())
    browser = _client_of(root, csrf=True)
    assert browser.get(_changelist(action)).status_code == 200
    passed = browser.post(
        _changelist(action), {**data, "csrfmiddlewaretoken": browser.cookies["csrftoken"].value}
    )
    assert passed.status_code == 302 and changed_tables(before, snapshot())
