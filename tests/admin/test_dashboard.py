"""The runs dashboard with Django's test client: its figures for a known set of runs, the
changelist each number links to, who may see it, and a query count that does not grow
with the table."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from io import StringIO
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_weft import runtime
from django_weft.models import Timer, WorkflowRun

from .conftest import change_url, changelist_url, logged_in, make_run

pytestmark = pytest.mark.django_db

DASHBOARD = "admin:django_weft_workflowrun_dashboard"


def dashboard_url() -> str:
    return reverse(DASHBOARD)


def finished(run: WorkflowRun, ago: timedelta, *, updated_ago: timedelta | None = None) -> WorkflowRun:
    """Mark ``run`` finished ``ago`` (and last updated ``updated_ago``, default the same)."""
    now = timezone.now()
    WorkflowRun.objects.filter(pk=run.pk).update(
        finished_at=now - ago, updated_at=now - (updated_ago if updated_ago is not None else ago)
    )
    run.refresh_from_db()
    return run


@pytest.fixture
def runs() -> dict[str, WorkflowRun]:
    now = timezone.now()
    minute = timedelta(minutes=1)
    made = {
        "done-5a": finished(make_run("order-1", status="completed"), 5 * minute),
        "done-5b": finished(make_run("order-2", status="completed"), 5 * minute),
        "done-30": finished(make_run("cart-1", status="completed", workflow="tests.m.cart"), 30 * minute),
        "failed-1": finished(make_run("order-3", status="failed", failure_category="activity"), minute),
        # Finished two hours ago: not in the hour, even though a finalizer touched it since.
        "done-old": finished(make_run("order-4", status="completed"), 120 * minute, updated_ago=10 * minute),
        "cancelled-old": finished(make_run("order-5", status="cancelled"), 120 * minute),
        "waiting-old": make_run(
            "order-6",
            status="waiting",
            waiting_on={"kind": "signal", "seq": 0, "name": "approve", "signals": ["approve"]},
        ),
        "waiting-new": make_run(
            "cart-2",
            status="waiting",
            workflow="tests.m.cart",
            waiting_on={"kind": "sleep", "seq": 0, "fire_at": (now - minute).isoformat()},
        ),
        "runnable": make_run("order-7", status="running", ready_at=now - 10.5 * minute),
        "runnable-new": make_run("order-8", status="running", ready_at=now - minute),
        "stuck": make_run(
            "order-9",
            status="running",
            owner_id="worker-gone",
            owner_epoch=1,
            lease_expires_at=now - timedelta(seconds=90),
            claimed_at=now - 20 * minute,
        ),
        "busy": make_run(
            "order-10",
            status="running",
            owner_id="worker-alive",
            owner_epoch=1,
            lease_expires_at=now + timedelta(seconds=30),
            claimed_at=now - minute,
        ),
        "pending": make_run("order-11", status="pending"),
        "suspended": make_run("order-12", status="suspended", workflow="tests.m.cart"),
    }
    WorkflowRun.objects.filter(pk=made["waiting-old"].pk).update(
        updated_at=now - timedelta(hours=3, seconds=30)
    )
    waiting_new = made["waiting-new"]
    Timer.objects.create(run=waiting_new, seq=0, kind="sleep", fire_at=now - minute)  # due
    Timer.objects.create(
        run=made["waiting-old"], seq=0, kind="signal_timeout", fire_at=now + timedelta(hours=1)
    )
    Timer.objects.create(run=made["done-5a"], seq=0, kind="sleep", fire_at=now - 30 * minute, fired_at=now)
    return made


def figures(page: str) -> dict[str, tuple[int, str]]:
    """``data-figure`` name -> (the number shown, the link)."""
    found = {}
    for href, name, body in re.findall(r'<a [^>]*href="([^"]*)" data-figure="([^"]*)">(.*?)</a>', page, re.S):
        count = re.search(r'<span class="weft-tile-count">(\d+)</span>', body)
        assert count is not None, body
        found[name] = (int(count.group(1)), html.unescape(href))
    return found


def workflow_cells(page: str, workflow: str) -> dict[str, tuple[int, str]]:
    """The per-workflow table's row for ``workflow``: link query -> (number, link)."""
    row = re.search(rf'<tr data-workflow="{re.escape(workflow)}">(.*?)</tr>', page, re.S)
    assert row is not None, f"no row for {workflow}"
    return {
        html.unescape(href): (int(count), html.unescape(href))
        for href, count in re.findall(r'<a href="([^"]*)">(\d+)</a>', row.group(1))
    }


def listed(client: Client, url: str) -> set[str]:
    """The workflow ids in the changelist at ``url``."""
    response = client.get(url)
    assert response.status_code == 200, url
    assert "?e=1" not in response.get("Location", "")
    return set(
        re.findall(r'<th class="field-workflow_id"><a href="[^"]*">([^<]*)</a>', response.content.decode())
    )


def query_of(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


# -- the figures ------------------------------------------------------------------------


def test_status_counts_and_their_links(admin_client_: Client, runs: dict[str, WorkflowRun]) -> None:
    response = admin_client_.get(dashboard_url())
    assert response.status_code == 200
    shown = figures(response.content.decode())
    assert shown["total"] == (len(runs), changelist_url())
    expected = {
        "pending": 1,
        "running": 4,
        "waiting": 2,
        "suspended": 1,
        "completed": 4,
        "failed": 1,
        "cancelled": 1,
        "timed_out": 0,
        "continued": 0,
    }
    for status, count in expected.items():
        number, link = shown[f"status-{status}"]
        assert number == count, status
        assert query_of(link) == {"status__exact": [status]}
        assert len(listed(admin_client_, link)) == count, status


def test_counts_per_workflow_link_to_workflow_and_status(
    admin_client_: Client, runs: dict[str, WorkflowRun]
) -> None:
    page = admin_client_.get(dashboard_url()).content.decode()
    cart = workflow_cells(page, "tests.m.cart")
    by_query = {tuple(sorted((k, v[0]) for k, v in query_of(link).items())): n for n, link in cart.values()}
    assert by_query == {
        (("workflow", "tests.m.cart"),): 3,
        (("status__exact", "completed"), ("workflow", "tests.m.cart")): 1,
        (("status__exact", "waiting"), ("workflow", "tests.m.cart")): 1,
        (("status__exact", "suspended"), ("workflow", "tests.m.cart")): 1,
    }
    for number, link in cart.values():
        assert len(listed(admin_client_, link)) == number
    echo = workflow_cells(page, "tests.echo")
    totals = [number for number, link in echo.values() if set(query_of(link)) == {"workflow"}]
    assert totals == [11]


def test_expired_leases_and_due_timers_link_to_the_overdue_runs(
    admin_client_: Client, runs: dict[str, WorkflowRun]
) -> None:
    shown = figures(admin_client_.get(dashboard_url()).content.decode())
    count, link = shown["expired-leases"]
    assert count == 1 and query_of(link) == {"overdue": ["lease"]}
    assert listed(admin_client_, link) == {"order-9"}
    count, link = shown["due-timers"]
    assert count == 1 and query_of(link) == {"overdue": ["timer"]}
    assert listed(admin_client_, link) == {"cart-2"}


def test_finished_in_the_last_hour_and_the_sparkline(
    admin_client_: Client, runs: dict[str, WorkflowRun]
) -> None:
    page = admin_client_.get(dashboard_url()).content.decode()
    count, link = figures(page)["finished"]
    assert count == 4 and query_of(link) == {"finished": ["1h"]}
    assert listed(admin_client_, link) == {"order-1", "order-2", "cart-1", "order-3"}
    svg = re.search(r'<svg class="weft-sparkline".*?</svg>', page, re.S)
    assert svg is not None
    counts = [int(n) for n in re.findall(r'data-count="(\d+)"', svg.group(0))]
    assert len(counts) == 60 and sum(counts) == 4 and max(counts) == 2


def test_finished_per_minute_buckets_by_minute_of_finish(runs: dict[str, WorkflowRun]) -> None:
    now = timezone.now()
    report = runtime.finished_per_minute(60, now=now)
    assert len(report.counts) == 60
    assert report.start == now.replace(second=0, microsecond=0) - timedelta(minutes=59)
    expected = [0] * 60
    for key in ("done-5a", "done-5b", "done-30", "failed-1"):
        finished_at = runs[key].finished_at
        assert finished_at is not None
        expected[int((finished_at - report.start).total_seconds() // 60)] += 1
    assert list(report.counts) == expected
    assert report.total == 4 and report.peak == 2
    assert report.minute(59) == now.replace(second=0, microsecond=0)


def test_finished_per_minute_of_an_empty_hour() -> None:
    report = runtime.finished_per_minute(60)
    assert report.counts == (0,) * 60 and report.total == 0 and report.peak == 0


def test_oldest_waiting_and_runnable_runs_link_to_their_pages(
    admin_client_: Client, runs: dict[str, WorkflowRun]
) -> None:
    page = admin_client_.get(dashboard_url()).content.decode()
    waiting = re.search(r'<tr id="weft-oldest-waiting">(.*?)</tr>', page, re.S)
    assert waiting is not None
    assert f'href="{change_url(runs["waiting-old"])}"' in waiting.group(1)
    assert "waiting for 3 h 0 min" in waiting.group(1) and "signal approve" in waiting.group(1)
    runnable = re.search(r'<tr id="weft-oldest-runnable">(.*?)</tr>', page, re.S)
    assert runnable is not None
    assert f'href="{change_url(runs["runnable"])}"' in runnable.group(1)
    assert "unclaimed for 10 min" in runnable.group(1)


def test_status_report_counts_per_workflow(runs: dict[str, WorkflowRun]) -> None:
    report = runtime.status_report()
    assert report.counts_by_workflow == {
        "tests.echo": {"completed": 3, "failed": 1, "cancelled": 1, "waiting": 1, "running": 4, "pending": 1},
        "tests.m.cart": {"completed": 1, "waiting": 1, "suspended": 1},
    }
    assert sum(report.counts.values()) == len(runs)
    assert report.expired_leases == 1 and report.due_timers == 1
    assert report.oldest_waiting is not None and report.oldest_waiting.workflow_id == "order-6"
    out = StringIO()
    call_command("weft_status", stdout=out)
    assert "oldest waiting: tests.echo order-6" in out.getvalue()


def test_an_empty_database(admin_client_: Client) -> None:
    response = admin_client_.get(dashboard_url())
    assert response.status_code == 200
    page = response.content.decode()
    assert figures(page)["total"][0] == 0
    assert "No runs yet." in page
    assert '<svg class="weft-sparkline"' in page


# -- where it is linked from --------------------------------------------------------------


def test_the_app_index_and_the_changelist_link_to_it(db: None) -> None:
    viewer = logged_in("viewer", permissions=("view_workflowrun",))
    link = f'href="{dashboard_url()}"'
    index = viewer.get(reverse("admin:app_list", args=["django_weft"]))
    assert index.status_code == 200 and link in index.content.decode()
    changelist = viewer.get(changelist_url()).content.decode()
    assert link in changelist
    page = viewer.get(dashboard_url()).content.decode()
    assert f'<a href="{changelist_url()}">Workflow runs</a>' in page  # the breadcrumbs


# -- who may see it ---------------------------------------------------------------------


def test_view_permission_is_enough(runs: dict[str, WorkflowRun]) -> None:
    viewer = logged_in("viewer", permissions=("view_workflowrun",))
    response = viewer.get(dashboard_url())
    assert response.status_code == 200
    assert figures(response.content.decode())["total"][0] == len(runs)


def test_staff_without_view_permission_gets_403(db: None) -> None:
    clerk = logged_in("clerk")
    assert clerk.get(dashboard_url()).status_code == 403
    app_index = clerk.get(reverse("admin:app_list", args=["django_weft"]))
    assert app_index.status_code == 404  # no model of the app is theirs to see


@pytest.mark.parametrize("who", ["anonymous", "not staff"])
def test_others_are_sent_to_the_login_page(db: None, who: str) -> None:
    user = (
        Client()
        if who == "anonymous"
        else logged_in("visitor", staff=False, permissions=("view_workflowrun",))
    )
    response = user.get(dashboard_url())
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_it_only_reads(admin_client_: Client, runs: dict[str, WorkflowRun]) -> None:
    before = list(WorkflowRun.objects.order_by("pk").values())
    assert admin_client_.post(dashboard_url(), {"status": "cancelled"}).status_code == 405
    with CaptureQueriesContext(connection) as queries:
        admin_client_.get(dashboard_url())
    written = [
        q["sql"] for q in queries if q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))
    ]
    # The session middleware may save the session; the runs are never written.
    assert all("django_session" in sql for sql in written)
    assert list(WorkflowRun.objects.order_by("pk").values()) == before


@pytest.mark.parametrize(
    "query",
    [
        "?status__exact=nonsense",
        "?minutes=-1&workflow=%00",
        "?e=1&q=%ff%fe",
        "?" + "x" * 5000,
        "?finished=1h&overdue=lease",
    ],
)
def test_garbage_query_parameters_are_ignored(
    admin_client_: Client, runs: dict[str, WorkflowRun], query: str
) -> None:
    response = admin_client_.get(dashboard_url() + query)
    assert response.status_code == 200
    assert figures(response.content.decode())["total"][0] == len(runs)


@pytest.mark.parametrize(
    "query",
    [
        "?overdue=nonsense",
        "?finished=1h&overdue=timer&status__exact=waiting",
        "?finished=24h",
    ],
)
def test_the_new_changelist_filters_take_any_value(
    admin_client_: Client, runs: dict[str, WorkflowRun], query: str
) -> None:
    assert admin_client_.get(changelist_url() + query).status_code == 200


def test_a_nul_in_a_filter_is_ignored_with_a_message(
    admin_client_: Client, runs: dict[str, WorkflowRun]
) -> None:
    # As on every django_weft changelist: no column holds a NUL (PostgreSQL refuses it).
    response = admin_client_.get(changelist_url() + "?finished=%00", follow=True)
    assert response.redirect_chain == [(changelist_url(), 302)]
    assert "The address holds a NUL character; it was ignored." in response.content.decode()


# -- cost ---------------------------------------------------------------------------------


def _queries(client: Client) -> list[dict[str, Any]]:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(dashboard_url()).status_code == 200
    return list(queries)


def test_the_query_count_does_not_grow_with_the_runs(
    django_assert_max_num_queries: Any, runs: dict[str, WorkflowRun]
) -> None:
    viewer = logged_in("viewer", permissions=("view_workflowrun",))
    few = len(_queries(viewer))
    now = timezone.now()
    WorkflowRun.objects.bulk_create(
        WorkflowRun(
            workflow_id=f"bulk-{index}",
            workflow_name=f"tests.bulk{index % 25}",
            status=("completed", "failed", "waiting", "running")[index % 4],
            finished_at=now - timedelta(seconds=index) if index % 4 < 2 else None,
        )
        for index in range(600)
    )
    many = _queries(viewer)
    assert len(many) == few
    assert not any("django_weft_schedule" in query["sql"] for query in many)  # not theirs to see
    # Session and user, the user's permissions (two), the figures (seven at most), the
    # waited step of the oldest waiting run, the live workers, the busiest concurrency keys,
    # the rate limits behind, the busiest activity concurrency groups.
    with django_assert_max_num_queries(16):
        viewer.get(dashboard_url())
    page = viewer.get(dashboard_url()).content.decode()
    assert figures(page)["total"][0] == len(runs) + 600
