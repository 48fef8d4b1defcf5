"""The read-only run detail page: inputs and outcome, ownership, family, the timeline with
one ``data-seq`` per history entry, the steps table."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_weft import UpdateTimeout, client
from django_weft.engine.executor import TurnOutcome
from django_weft.models import Step, WorkflowRun
from django_weft.runtime import read_history
from django_weft.testing import drive, make_engine
from tests.support.driver import park

from .conftest import change_url, make_run, make_step

pytestmark = pytest.mark.django_db(transaction=True)


def timeline_of(html: str) -> str:
    found = re.search(r'<svg class="weft-timeline".*?</svg>', html, re.S)
    assert found is not None, "no timeline on the page"
    return found.group(0)


def test_a_run_with_a_timer_signals_and_an_update_has_one_timeline_element_per_entry(
    admin_client_: Client,
) -> None:
    handle = client.start("tests.m.sleep_with_handlers", args=[3600], id="notes-1")
    park(handle.run_id)
    handle.signal("note", "a")
    assert make_engine("second").run_turn(handle.run_id) == TurnOutcome.PARKED
    with pytest.raises(UpdateTimeout):
        handle.update("notes", wait=0)
    assert make_engine("third").run_turn(handle.run_id) == TurnOutcome.PARKED
    handle.signal("note", "b")
    assert make_engine("fourth").run_turn(handle.run_id) == TurnOutcome.PARKED

    run = WorkflowRun.objects.get(pk=handle.run_id)
    entries = read_history(run)
    kinds = [(entry.kind, entry.name) for entry in entries]
    assert ("sleep", "sleep") in kinds and ("handler", "update:notes") in kinds
    assert kinds.count(("handler", "signal:note")) == 2

    response = admin_client_.get(change_url(run))
    assert response.status_code == 200
    html = response.content.decode()
    svg = timeline_of(html)
    assert re.findall(r'data-seq="(\d+)"', svg) == [str(entry.seq) for entry in entries]
    assert svg.count("<title>") == len(entries)
    assert 'class="weft-marker"' in svg  # the handlers
    assert "weft-kind-sleep" in svg and "weft-open" in svg  # the timer still runs
    # The steps table below, and what the run waits on, in words.
    assert len(re.findall(r'<tr class="weft-step-row[^"]*" data-seq=', html)) == len(entries)
    assert "timer " in html and "weft-badge-waiting" in html
    assert "Ownership" in html and "lease expires at" in html.lower()


def test_inputs_outcome_error_and_search_attributes_are_pretty_printed(admin_client_: Client) -> None:
    run = make_run(
        "order-9",
        status="failed",
        args=[42, {"sku": "A-1"}],
        kwargs={"express": True},
        error={
            "type": "ValueError",
            "message": "no <stock>",
            "traceback": "Traceback (most recent call last):\n  boom",
        },
        search_attributes={"customer": 7},
        finished_at=timezone.now(),
        owner_epoch=3,
    )
    html = admin_client_.get(change_url(run)).content.decode()
    assert '<pre class="weft-json">[\n  42,\n  {\n    &quot;sku&quot;: &quot;A-1&quot;\n  }\n]</pre>' in html
    assert "&quot;express&quot;: true" in html
    assert "no &lt;stock&gt;" in html and "no <stock>" not in html
    assert '<pre class="weft-traceback">Traceback (most recent call last):\n  boom</pre>' in html
    assert "&quot;customer&quot;: 7" in html
    assert "No steps recorded yet." in html
    # Times to the second.
    assert timezone.localtime(run.created_at).strftime("%Y-%m-%d %H:%M:%S") in html


def test_a_run_that_failed_shows_its_error_and_traceback(admin_client_: Client) -> None:
    handle = client.start("tests.raises", id="raises-1")
    assert drive(handle.run_id) == "failed"
    run = WorkflowRun.objects.get(pk=handle.run_id)
    html = admin_client_.get(change_url(run)).content.decode()
    assert "weft-badge-failed" in html
    assert "&quot;type&quot;: &quot;KeyError&quot;" in html
    trace = re.search(r'<pre class="weft-traceback">(.*?)</pre>', html, re.S)
    assert trace is not None and "Traceback (most recent call last)" in trace.group(1)
    assert "missing thing" in trace.group(1)
    assert 'data-seq="0"' in timeline_of(html)


def test_parent_and_children_link_to_each_other(admin_client_: Client) -> None:
    parent = make_run("order-1", status="waiting", workflow="tests.c.parent")
    children = [
        make_run(f"order-1-child-{i}", status="running", workflow="tests.c.child", parent=parent)
        for i in range(3)
    ]
    parent_html = admin_client_.get(change_url(parent)).content.decode()
    for child in children:
        assert f'href="{change_url(child)}"' in parent_html
    child_html = admin_client_.get(change_url(children[0])).content.decode()
    assert f'href="{change_url(parent)}"' in child_html
    # A fixed number of queries, whatever the number of children.
    more = [make_run(f"order-1-more-{i}", status="running", parent=parent) for i in range(10)]
    with CaptureQueriesContext(connection) as queries:
        assert admin_client_.get(change_url(parent)).status_code == 200
    assert len(queries) <= 8, [q["sql"][:80] for q in queries.captured_queries]
    assert f'href="{change_url(more[-1])}"' in admin_client_.get(change_url(parent)).content.decode()


def test_a_long_history_renders_and_pages_its_table(admin_client_: Client) -> None:
    run = make_run("long-1", status="running", workflow="tests.inline_steps")
    start = timezone.now() - timedelta(hours=1)
    Step.objects.bulk_create(
        [
            Step(
                run=run,
                seq=i,
                kind="activity",
                name="tests.record",
                status="completed",
                args=[i],
                result={"n": i},
                started_at=start + timedelta(seconds=i),
                finished_at=start + timedelta(seconds=i, milliseconds=500),
            )
            for i in range(1000)
        ]
    )
    make_step(run, 1000, "sleep", "sleep", "waiting", started_at=start + timedelta(seconds=1000))
    with CaptureQueriesContext(connection) as queries:
        html = admin_client_.get(change_url(run)).content.decode()
    assert len(re.findall(r'data-seq="\d+"', timeline_of(html))) == 1001
    assert "Steps 1 to 200 of 1001" in html
    # The whole history without payloads (the timeline shows none), then the payloads of
    # the table's 200 steps only: a long history of large results is not read whole.
    step_reads = [q["sql"] for q in queries.captured_queries if 'FROM "django_weft_step"' in q["sql"]]
    assert len(step_reads) == 2, step_reads
    outline, payloads = step_reads
    assert '"django_weft_step"."result"' not in outline and '"django_weft_step"."args"' not in outline
    assert '"django_weft_step"."result"' in payloads and payloads.count(", 199") == 1
    page_2 = admin_client_.get(change_url(run), {"steps_page": "2"}).content.decode()
    assert "Steps 201 to 400 of 1001" in page_2
    results = {int(n) for n in re.findall(r"&quot;n&quot;: (\d+)", page_2)}
    assert results == set(range(200, 400))
    page_6 = admin_client_.get(change_url(run), {"steps_page": "6"}).content.decode()
    assert "Steps 1001 to 1001 of 1001" in page_6


def test_a_scheduled_run_links_back_to_its_schedule(admin_client_: Client) -> None:
    client.create_schedule("nightly-report", "tests.echo", every="1d")
    action = client.get_schedule_handle("nightly-report").trigger()
    run = WorkflowRun.objects.get(pk=action["run_id"])
    schedule_url = "/admin/django_weft/schedule/nightly-report/change/"
    html = admin_client_.get(change_url(run)).content.decode()
    assert f'<a href="{schedule_url}">nightly-report</a>, the fire of ' in html

    client.get_schedule_handle("nightly-report").delete()
    html = admin_client_.get(change_url(run)).content.decode()
    assert "nightly-report (deleted since), the fire of " in html
    assert schedule_url not in html


def test_a_run_no_schedule_started_shows_no_schedule(admin_client_: Client) -> None:
    run = make_run("hand-made", search_attributes={"weft_schedule_id": 7})  # not a schedule's id: left alone
    html = admin_client_.get(change_url(run)).content.decode()
    assert "the fire of" not in html
