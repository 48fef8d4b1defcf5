"""The run changelist with Django's test client: badges, waits in words, filters, search,
and no count of the whole table."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_weft import client
from django_weft.admin.runs.changelist import LookAheadPaginator
from django_weft.models import WorkflowRun

from .conftest import change_url, changelist_url, make_run, make_step

pytestmark = pytest.mark.django_db


def shown(response: object) -> set[str]:
    """The workflow ids in the changelist's rows."""
    html = response.content.decode()  # type: ignore[attr-defined]
    return set(re.findall(r'<th class="field-workflow_id"><a href="[^"]*">([^<]*)</a>', html))


@pytest.fixture
def runs() -> dict[str, WorkflowRun]:
    now = timezone.now()
    today_1405 = now.replace(hour=14, minute=5, second=0, microsecond=0)
    made = {
        "done": make_run("order-1", status="completed", finished_at=now),
        "broken": make_run(
            "order-2",
            status="failed",
            failure_category="activity",
            error={"type": "ValueError", "message": "bad"},
            finished_at=now,
        ),
        "approval": make_run(
            "order-3",
            status="waiting",
            workflow="tests.m.cart",
            waiting_on={"kind": "signal", "seq": 1, "name": "approve", "signals": ["approve"]},
            search_attributes={"customer": 7, "region": "north"},
        ),
        "sleeping": make_run(
            "order-4",
            status="waiting",
            waiting_on={"kind": "sleep", "seq": 0, "fire_at": today_1405.isoformat()},
            search_attributes={"customer": "7"},
        ),
        "queued": make_run(
            "order-5",
            status="waiting",
            workflow="tests.q.single",
            waiting_on={"kind": "activities", "mode": "all", "seqs": [0]},
        ),
        "parent": make_run(
            "order-6",
            status="waiting",
            workflow="tests.c.parent",
            waiting_on={"kind": "activities", "mode": "all", "seqs": [0]},
        ),
        "updating": make_run(
            "order-8",
            status="waiting",
            waiting_on={"kind": "condition", "seq": 0, "updates": ["x"]},
        ),
        "running": make_run("order-9", status="running"),
        "suspended": make_run("order-10", status="suspended"),
        "pending": make_run("order-11", status="pending"),
        "old": make_run("order-12", status="cancelled", created_at=now - timedelta(days=40), finished_at=now),
        "forgotten": make_run("order-13", workflow="gone.workflow", status="timed_out", finished_at=now),
    }
    make_step(made["queued"], 0, "activity", "tests.q.record", "scheduled")
    make_step(
        made["parent"],
        0,
        "child",
        "tests.c.child",
        "waiting",
        result={"run_id": "x", "workflow_id": "order-7"},
    )
    made["child"] = make_run("order-7", status="running", workflow="tests.c.child", parent=made["parent"])
    return made


def test_changelist_shows_badges_columns_and_waits_in_words(
    admin_client_: Client, runs: dict[str, WorkflowRun]
) -> None:
    response = admin_client_.get(changelist_url())
    assert response.status_code == 200
    html = response.content.decode()
    for status in ("completed", "failed", "waiting", "running", "suspended", "pending", "cancelled"):
        assert f'class="weft-badge weft-badge-{status}"' in html
    assert 'class="weft-badge weft-badge-timed-out"' in html
    assert "django_weft/admin.css" in html
    for words in (
        "signal approve",
        "timer 14:05",
        "activity tests.q.record on tests",
        "child order-7",
        "condition on update x",
        "running for",
        "not started",
    ):
        assert words in html, words
    assert shown(response) == {run.workflow_id for run in runs.values()}
    # Newest first; no add button (the action checkboxes: test_actions.py).
    assert html.index(">order-7<") < html.index(">order-1<")
    # Only "created" sorts (another order would sort the whole list on every view); it is
    # column 4, after the action checkboxes.
    assert set(re.findall(r'href="\?o=([^"&]*)', html)) <= {"", "4", "-4", "4.-4", "-4.4"}
    assert "workflowrun/add/" not in html


def test_filters(admin_client_: Client, runs: dict[str, WorkflowRun]) -> None:
    url = changelist_url()
    assert shown(admin_client_.get(url, {"status__exact": "failed"})) == {"order-2"}
    assert shown(admin_client_.get(url, {"workflow": "tests.m.cart"})) == {"order-3"}
    assert shown(admin_client_.get(url, {"failure_category__exact": "activity"})) == {"order-2"}
    assert shown(admin_client_.get(url, {"has_parent": "yes"})) == {"order-7"}
    assert "order-7" not in shown(admin_client_.get(url, {"has_parent": "no"}))
    # The created filter's own "Past 7 days" link.
    page = admin_client_.get(url).content.decode()
    link = re.search(r'<a href="(\?created_at__gte=[^"]*)"[^>]*>Past 7 days</a>', page)
    assert link is not None
    recent = shown(admin_client_.get(url + link.group(1).replace("&amp;", "&")))
    assert "order-12" not in recent and "order-1" in recent


def test_the_workflow_filter_lists_registered_workflows_not_the_table(
    admin_client_: Client, runs: dict[str, WorkflowRun]
) -> None:
    html = admin_client_.get(changelist_url()).content.decode()
    assert "?workflow=tests.m.cart" in html and "?workflow=tests.echo" in html
    assert "?workflow=gone.workflow" not in html  # only in the table, no longer registered


def test_search_by_run_id_workflow_id_and_search_attributes(
    admin_client_: Client, runs: dict[str, WorkflowRun]
) -> None:
    url = changelist_url()
    assert shown(admin_client_.get(url, {"q": str(runs["broken"].pk)})) == {"order-2"}
    assert shown(admin_client_.get(url, {"q": "order-5"})) == {"order-5"}
    assert shown(admin_client_.get(url, {"q": "order"})) == set()  # ids match exactly
    # 7 is the number 7 or the string "7".
    assert shown(admin_client_.get(url, {"q": "customer=7"})) == {"order-3", "order-4"}
    assert shown(admin_client_.get(url, {"q": "customer=7 region=north"})) == {"order-3"}
    searched = admin_client_.get(url, {"q": "order-4 customer=7"})
    assert shown(searched) == {"order-4"}
    assert "1 result (" in searched.content.decode()
    assert " results (" not in admin_client_.get(url).content.decode()  # nothing searched


def test_a_bad_attribute_name_is_a_message_not_an_error(
    admin_client_: Client, runs: dict[str, WorkflowRun]
) -> None:
    response = admin_client_.get(changelist_url(), {"q": "no spaces!=1"})
    assert response.status_code == 200
    assert shown(response) == set()
    assert "a search attribute name is letters" in response.content.decode()


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"status__exact": "waiting"},
        {"failure_category__exact": "activity"},
        {"workflow": "tests.echo"},
        {"has_parent": "yes"},
        {"q": "customer=7"},
        {"q": "order-3"},
        {"p": "2"},
    ],
    ids=[
        "first page",
        "filtered",
        "failure",
        "workflow",
        "children",
        "attribute search",
        "id search",
        "page 2",
    ],
)
def test_the_changelist_counts_nothing(
    admin_client_: Client, runs: dict[str, WorkflowRun], params: dict[str, str]
) -> None:
    WorkflowRun.objects.bulk_create(
        [
            WorkflowRun(workflow_id=f"bulk-{i}", workflow_name="tests.echo", status="completed")
            for i in range(60)
        ]
    )
    with CaptureQueriesContext(connection) as queries:
        response = admin_client_.get(changelist_url(), params)
    assert response.status_code == 200
    run_queries = [q["sql"] for q in queries.captured_queries if 'FROM "django_weft_workflowrun"' in q["sql"]]
    assert run_queries
    assert not [sql for sql in run_queries if "COUNT(" in sql.upper()]
    # Every read of the list follows the index weft_run_created: newest first, then id.
    order = 'ORDER BY "django_weft_workflowrun"."created_at" DESC, "django_weft_workflowrun"."id" ASC'
    assert all(order in sql for sql in run_queries if "ORDER BY" in sql)
    # One query for the steps the page's parked runs wait on, without a join; none per row.
    step_queries = [q["sql"] for q in queries.captured_queries if 'FROM "django_weft_step"' in q["sql"]]
    assert len(step_queries) <= 1 and not [sql for sql in step_queries if "JOIN" in sql]
    # Session, user, the look-ahead ids, the page, its waited steps; on PostgreSQL the
    # unfiltered list also reads the planner's estimate.
    assert len(queries) <= 6, [q["sql"][:80] for q in queries.captured_queries]
    # The page reads the listed columns only: payloads and ownership stay in the database.
    selected = [sql.split(" FROM ", 1)[0] for sql in run_queries]
    for column in ("args", "kwargs", "result", "error", "search_attributes", "owner_id"):
        assert not [sql for sql in selected if f'"django_weft_workflowrun"."{column}"' in sql], column


def test_each_value_filter_has_an_index_in_the_list_order() -> None:
    """A filter on a rare value must not walk the list's index past every other run: the
    status, failure category and workflow filters each lead an index in the list order.
    (At a million runs the failure filter read the whole table before
    ``weft_run_failure_created``; ``benchmarks/admin.py --explain`` shows each plan.)"""
    from django_weft.admin.runs import WorkflowRunAdmin
    from django_weft.admin.runs.changelist import WorkflowNameFilter

    columns = [name for name in WorkflowRunAdmin.list_filter if isinstance(name, str)]
    assert WorkflowNameFilter in WorkflowRunAdmin.list_filter
    columns.append("workflow_name")
    leading = {tuple(index.fields[:2]) for index in WorkflowRun._meta.indexes}
    for column in columns:
        assert (column, "-created_at") in leading, column


@pytest.mark.postgres
def test_an_unfiltered_list_on_postgresql_shows_the_planner_estimate(
    admin_client_: Client, runs: dict[str, WorkflowRun]
) -> None:
    WorkflowRun.objects.bulk_create(
        [
            WorkflowRun(workflow_id=f"bulk-{i}", workflow_name="tests.echo", status="completed")
            for i in range(60)
        ]
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_weft_workflowrun")
    with CaptureQueriesContext(connection) as queries:
        html = admin_client_.get(changelist_url()).content.decode()
    assert re.search(r"about [\d,]+ in all \(database estimate\)", html)
    assert not [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    filtered = admin_client_.get(changelist_url(), {"status__exact": "waiting"}).content.decode()
    assert "database estimate" not in filtered


def test_pages_say_when_the_list_goes_on(
    admin_client_: Client, runs: dict[str, WorkflowRun], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(LookAheadPaginator, "look_ahead_pages", 1)
    WorkflowRun.objects.bulk_create(
        [
            WorkflowRun(workflow_id=f"bulk-{i}", workflow_name="tests.echo", status="completed")
            for i in range(60)
        ]
    )
    total = WorkflowRun.objects.count()  # 73
    first = admin_client_.get(changelist_url())
    assert len(shown(first)) == 50
    assert "at least 51 workflow runs" in first.content.decode()
    second = admin_client_.get(changelist_url(), {"p": "2"})
    assert len(shown(second)) == total - 50
    assert f"{total} workflow runs" in second.content.decode()
    assert "at least" not in second.content.decode()
    assert shown(first).isdisjoint(shown(second))


@pytest.mark.parametrize(
    "params",
    [
        {"q": "order-1\x00"},
        {"q": "customer=7\x00"},
        {"q": "customer__gt=1"},
        {"q": "customer\n=1"},
        {"q": "customer=NaN"},
        {"q": "customer=Infinity"},
        {"q": "customer=1e999"},
        {"q": "customer=" + "9" * 400},
        {"p": "1" + "0" * 30},
        {"p": "-3"},
        {"p": "two"},
        {"status__exact": "\x00"},
        {"workflow": "\x00"},
        {"workflow_name__exact": "a\x00b"},
        {"failure_category__exact": "\x00"},
        {"parent": "\x00"},
        {"created_at__gte": "\x00"},
        {"finished": "\x00"},
        {"o": "\x00"},
        {"\x00": "1"},
    ],
    ids=lambda params: repr(params)[:40],
)
def test_odd_input_is_never_a_server_error(
    admin_client_: Client, runs: dict[str, WorkflowRun], params: dict[str, str]
) -> None:
    response = admin_client_.get(changelist_url(), params)
    assert response.status_code in (200, 302)


def test_a_debounced_run_says_when_it_starts_and_how_many_starts_it_collapsed(admin_client_: Client) -> None:
    handles = [client.start("tests.debounce.reindex", args=["products"], kwargs={"n": n}) for n in range(3)]
    run = WorkflowRun.objects.get(pk=handles[0].run_id)
    starts_at = timezone.localtime(datetime.fromisoformat(run.waiting_on["starts_at"]))
    words = f"debounced: starts at {starts_at:%H:%M:%S} (3 starts collapsed)"
    assert words in admin_client_.get(changelist_url()).content.decode()
    assert words in admin_client_.get(change_url(run)).content.decode()
