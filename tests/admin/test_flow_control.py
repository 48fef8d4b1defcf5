"""Flow control in the admin, with Django's test client: a queued run's reason in the run
list, the "flow control" and "concurrency key" filters, a run's priority, key and slot
with the slots in use read when its page loads, the dashboard's busiest concurrency keys
(bounded, from the partial index, the same figures as ``weft_status``), and the priority
and ``on_limit`` refusals of the Start workflow form. On both databases."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_weft import client, runtime
from django_weft.models import WorkflowRun
from django_weft.runtime.process import get_engine

from .conftest import change_url, changelist_url, logged_in, make_run

pytestmark = pytest.mark.django_db(transaction=True)

DASHBOARD = "admin:django_weft_workflowrun_dashboard"
START = "admin:django_weft_workflowrun_start"


def turn(run_id: str) -> str:
    return str(get_engine().run_turn(run_id))


def holder_and_queued(workflow: str, key: str, queued: int = 1) -> tuple[str, list[str]]:
    """A run holding a slot of ``key`` and ``queued`` runs queued for one."""
    holder = client.start(workflow, args=[key]).run_id
    assert turn(holder) == "parked"
    waiting = [client.start(workflow, args=[key]).run_id for _ in range(queued)]
    for run_id in waiting:
        assert turn(run_id) == "not_claimed"
    return holder, waiting


def listed(admin: Client, query: str = "") -> list[str]:
    """The run ids the changelist lists for ``query``."""
    response = admin.get(f"{changelist_url()}{query}")
    assert response.status_code == 200
    return re.findall(r'name="_selected_action" value="([0-9a-f-]+)"', response.content.decode())


@pytest.fixture
def admin() -> Client:
    return logged_in("root", superuser=True)


def test_the_list_shows_why_a_run_is_queued(admin: Client) -> None:
    _, (queued,) = holder_and_queued("tests.flow.per_key", "c-1")
    page = admin.get(changelist_url()).content.decode()
    row = next(row for row in page.split("<tr") if queued in row)
    assert "queued: concurrency key c-1 (1 of 1 in use)" in html.unescape(row)


def test_the_flow_control_and_concurrency_key_filters(admin: Client) -> None:
    holder, queued = holder_and_queued("tests.flow.per_key", "c-1", queued=2)
    other, other_queued = holder_and_queued("tests.flow.per_key", "c-2")
    plain = client.start("tests.echo").run_id
    finished = make_run("gone-1", workflow="tests.flow.per_key", concurrency_key="c-9", slot="held")

    assert sorted(listed(admin, "?flow=queued")) == sorted([*queued, *other_queued])
    assert sorted(listed(admin, "?flow=holding")) == sorted([holder, other])  # not the finished one
    assert sorted(listed(admin, "?flow=none")) == [plain]
    assert sorted(listed(admin, "?concurrency_key=c-1")) == sorted([holder, *queued])
    assert listed(admin, "?concurrency_key=c-1&flow=holding") == [holder]
    # Any key in the address, whatever its runs' status.
    assert listed(admin, "?concurrency_key=c-9") == [str(finished.pk)]
    page = html.unescape(admin.get(changelist_url()).content.decode())
    assert "By flow control" in page and "?flow=queued" in page
    assert "By concurrency key" not in page  # nothing to offer without a query over the runs
    chosen = html.unescape(admin.get(f"{changelist_url()}?concurrency_key=c-2").content.decode())
    assert "By concurrency key" in chosen and '<a href="?concurrency_key=c-2">c-2</a>' in chosen


def test_a_runs_page_shows_its_priority_key_and_the_slots_in_use_now(admin: Client) -> None:
    holder = client.start("tests.flow.per_key", args=["c-1"], priority=-4).run_id
    assert turn(holder) == "parked"
    queued = client.start("tests.flow.per_key", args=["c-1"], priority=12).run_id
    assert turn(queued) == "not_claimed"

    page = html.unescape(admin.get(change_url(WorkflowRun.objects.get(pk=queued))).content.decode())
    assert re.search(r"<dt>priority</dt><dd>12</dd>", page)
    assert "<dt>concurrency</dt><dd>key c-1, queued for a slot, 1 of 1 in use</dd>" in page
    assert "<dt>waits on</dt><dd>queued: concurrency key c-1 (1 of 1 in use)</dd>" in page
    holding = html.unescape(admin.get(change_url(WorkflowRun.objects.get(pk=holder))).content.decode())
    assert "<dt>concurrency</dt><dd>key c-1, holds a slot, 1 of 1 in use</dd>" in holding
    assert "<dt>priority</dt><dd>-4</dd>" in holding

    # The holder is cancelled; no sweep has handed its slot on yet. The stored reason still
    # says 1 in use, the page reads 0.
    runtime.cancel(holder, "done with it")
    stored = WorkflowRun.objects.get(pk=queued)
    assert (stored.status, stored.waiting_on["in_use"]) == ("pending", 1)
    page = html.unescape(admin.get(change_url(stored)).content.decode())
    assert "<dt>waits on</dt><dd>queued: concurrency key c-1 (0 of 1 in use)</dd>" in page
    assert "<dt>concurrency</dt><dd>key c-1, queued for a slot, 0 of 1 in use</dd>" in page
    # A finished run holds nothing and counts nothing.
    finished = html.unescape(admin.get(change_url(WorkflowRun.objects.get(pk=holder))).content.decode())
    assert "<dt>concurrency</dt><dd>key c-1</dd>" in finished

    plain = client.start("tests.echo").run_id
    page = html.unescape(admin.get(change_url(WorkflowRun.objects.get(pk=plain))).content.decode())
    assert "<dt>priority</dt><dd>0</dd>" in page and "<dt>concurrency</dt>" not in page


def test_a_workflow_wide_limit_and_a_shared_one_are_named_so(admin: Client) -> None:
    one = client.start("tests.flow.one", args=["x"]).run_id
    assert turn(one) == "parked"
    page = html.unescape(admin.get(change_url(WorkflowRun.objects.get(pk=one))).content.decode())
    assert "<dt>concurrency</dt><dd>one limit for the workflow, holds a slot, 1 of 1 in use</dd>" in page
    fair = client.start("tests.flow.fair", args=["A"]).run_id
    assert turn(fair) == "parked"
    page = html.unescape(admin.get(change_url(WorkflowRun.objects.get(pk=fair))).content.decode())
    assert "key A (its workflow's slots are shared by all keys), holds a slot, 1 of 1 in use" in page


# -- the dashboard and weft_status -----------------------------------------------------------


def key_rows(admin: Client) -> list[tuple[str, ...]]:
    """The dashboard's busiest keys: (workflow, key, in use / limit, queued, queued longest)."""
    page = admin.get(reverse(DASHBOARD)).content.decode()
    section = page.split('id="weft-concurrency"', 1)[1].split("</section>", 1)[0]
    rows = []
    for row in re.findall(r"<tr data-concurrency=.*?</tr>", section, re.DOTALL):
        cells = re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.DOTALL)
        rows.append(tuple(html.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in cells))
    return rows


def test_the_dashboard_lists_the_busiest_keys_with_links_and_weft_status_prints_them(admin: Client) -> None:
    assert key_rows(admin) == []
    assert "No run holds or waits for a concurrency slot." in admin.get(reverse(DASHBOARD)).content.decode()
    holder, queued = holder_and_queued("tests.flow.per_key", "c-1", queued=2)
    holder_and_queued("tests.flow.per_key", "c-2", queued=0)
    fair_holder = client.start("tests.flow.fair", args=["A"]).run_id
    assert turn(fair_holder) == "parked"
    for key in ("B", "A"):
        assert turn(client.start("tests.flow.fair", args=[key]).run_id) == "not_claimed"
    assert turn(client.start("tests.flow.one", args=["x"]).run_id) == "parked"
    make_run("gone-1", status="running", workflow="tests.gone", concurrency_key="k", slot="held")
    # A delayed start takes its slot when it is due: until then it neither holds nor waits.
    client.start("tests.flow.per_key", args=["c-3"], start_delay="1h")
    # The run queued longest waited since it was queued (nothing else changes a queued run).
    WorkflowRun.objects.filter(pk=queued[0]).update(
        updated_at=timezone.now() - timedelta(minutes=5, seconds=3)
    )

    rows = key_rows(admin)
    assert [row[:4] for row in rows] == [
        ("tests.flow.fair", "(whole workflow)", "1 / 1", "2"),  # scope="workflow": one group
        ("tests.flow.per_key", "c-1", "1 / 1", "2"),
        ("tests.flow.one", "(whole workflow)", "1 / 1", "0"),
        ("tests.flow.per_key", "c-2", "1 / 1", "0"),
        ("tests.gone", "k", "1 / ?", "0"),  # not registered here: its limit is unknown
    ]
    assert rows[1][4].startswith("5 min")
    assert rows[2][4] == "none queued"

    page = html.unescape(admin.get(reverse(DASHBOARD)).content.decode())
    row = page.split('data-concurrency="tests.flow.per_key c-1"', 1)[1].split("</tr>", 1)[0]
    queued_link = re.search(r'href="([^"]+)">2</a>', row)
    assert queued_link is not None
    assert sorted(listed(admin, "?" + queued_link.group(1).split("?", 1)[1])) == sorted(queued)
    holding_link = f"{changelist_url()}?workflow=tests.flow.per_key&concurrency_key=c-1&flow=holding"
    assert holding_link in page and listed(admin, "?" + holding_link.split("?", 1)[1]) == [holder]
    assert f"{changelist_url()}?workflow=tests.flow.fair&flow=queued" in page

    out = StringIO()
    call_command("weft_status", stdout=out)
    printed = out.getvalue().split("busiest concurrency keys (at most 10):\n", 1)[1].splitlines()
    table = [line.split() for line in printed if line.startswith("  ")][:6]
    assert printed[6] == "rate limits: none behind"
    assert table[0] == ["workflow", "key", "in", "use", "queued", "queued", "longest"]
    assert [line[:4] for line in table[1:]] == [
        ["tests.flow.fair", "(whole", "workflow)", "1/1"],
        ["tests.flow.per_key", "c-1", "1/1", "2"],
        ["tests.flow.one", "(whole", "workflow)", "1/1"],
        ["tests.flow.per_key", "c-2", "1/1", "0"],
        ["tests.gone", "k", "1/?", "0"],
    ]
    assert float(table[2][4].rstrip("s")) >= 303


def test_at_most_ten_keys_are_listed_in_one_query_whatever_the_runs(admin: Client) -> None:
    for index in range(14):
        make_run(
            f"held-{index}",
            status="waiting",
            workflow="tests.flow.per_key",
            concurrency_key=f"k{index:02}",
            slot="held",
        )
    for index in range(3):
        make_run(
            f"queued-{index}",
            status="pending",
            workflow="tests.flow.per_key",
            concurrency_key="k13",
            slot="queued",
        )
    rows = key_rows(admin)
    assert len(rows) == 10
    assert rows[0][:4] == ("tests.flow.per_key", "k13", "1 / 1", "3")
    assert [row[1] for row in rows[1:]] == [f"k{index:02}" for index in range(9)]
    now = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        busiest = runtime.busiest_keys(now=now)
    assert len(queries) == 1 and len(busiest.keys) == 10


@pytest.mark.postgres
def test_the_busiest_keys_are_read_from_the_partial_index_never_the_table() -> None:
    for index in range(20):
        make_run(f"r-{index}", status="running" if index % 2 else "completed", workflow="tests.flow.per_key",
                 concurrency_key=f"k{index % 4}", slot="held")  # fmt: skip
    for index in range(200):  # active runs of no key: the other partial indexes of live runs hold them
        make_run(f"free-{index}", status="running")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_weft_workflowrun")
    with CaptureQueriesContext(connection) as queries:
        runtime.busiest_keys(now=timezone.now())
    (query,) = queries.captured_queries
    with transaction.atomic(), connection.cursor() as cursor:
        # The table is tiny: the planner would read it whole. With sequential scans
        # priced out, a plan that can use the index shows it; one that cannot still scans.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + query["sql"])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "weft_run_flow_live" in plan, plan
    assert "Seq Scan" not in plan, plan


# -- Start workflow -----------------------------------------------------------------------------


def test_the_start_form_takes_a_priority_and_says_what_a_limit_refuses(admin: Client) -> None:
    form = {"workflow": "tests.echo", "args": "", "kwargs": "", "on_conflict": "fail", "priority": "9"}
    response = admin.post(reverse(START), form)
    assert response.status_code == 302
    assert WorkflowRun.objects.get().priority == 9

    refused = admin.post(reverse(START), {**form, "priority": "101"})
    assert refused.status_code == 200
    assert "priority" in refused.context["adminform"].form.errors
    assert WorkflowRun.objects.count() == 1

    limited = {**form, "workflow": "tests.flow.refuse", "args": '["c-1"]', "priority": ""}
    assert admin.post(reverse(START), limited).status_code == 302
    assert WorkflowRun.objects.get(workflow_name="tests.flow.refuse").priority == 0
    refused = admin.post(reverse(START), limited)
    assert refused.status_code == 200
    errors = " ".join(refused.context["adminform"].form.non_field_errors())
    assert "on_limit='cancel_new'" in errors and "concurrency slot" in errors
    assert WorkflowRun.objects.filter(workflow_name="tests.flow.refuse").count() == 1

    skipped = {**form, "workflow": "tests.flow.singleton", "args": '["c-1"]'}
    admin.post(reverse(START), skipped)
    holder = WorkflowRun.objects.get(workflow_name="tests.flow.singleton")
    response = admin.post(reverse(START), skipped, follow=True)
    assert response.redirect_chain[-1][0] == change_url(holder)
    shown = [str(message) for message in response.context["messages"]]
    assert any("skips starts until one frees; no new run was started" in message for message in shown), shown
    assert WorkflowRun.objects.filter(workflow_name="tests.flow.singleton").count() == 1
