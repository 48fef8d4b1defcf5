"""The run page's signals, updates and timers tables: what each row says, the cap on long
lists, and the runtime's read functions behind them."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from django_weft import UpdateFailed, UpdateTimeout, client, runtime
from django_weft.engine.executor import TurnOutcome
from django_weft.models import Signal, WorkflowRun
from django_weft.testing import make_engine
from tests.support.driver import park

from .conftest import change_url, make_run

pytestmark = pytest.mark.django_db(transaction=True)


def section(html: str, element_id: str) -> str:
    found = re.search(rf'<section class="[^"]*" id="{element_id}">(.*?)\n</section>', html, re.S)
    assert found is not None, f"no #{element_id} on the page"
    return found.group(1)


def test_a_parked_run_shows_its_signals_updates_and_timer(admin_client_: Client) -> None:
    handle = client.start("tests.m.sleep_with_handlers", args=[3600], id="tables-1")
    park(handle.run_id)
    handle.signal("note", {"text": "first"}, signal_id="note-1")
    handle.signal("ping", "nobody waits for this")
    assert make_engine("second").run_turn(handle.run_id) == TurnOutcome.PARKED
    with pytest.raises(UpdateTimeout):
        handle.update("notes", update_id="notes-1", wait=0)
    assert make_engine("third").run_turn(handle.run_id) == TurnOutcome.PARKED

    html = admin_client_.get(change_url(WorkflowRun.objects.get(pk=handle.run_id))).content.decode()

    signals = section(html, "weft-signals")
    assert "Signals (2)" in signals
    rows = re.findall(r'<tr class="weft-signal-row".*?</tr>', signals, re.S)
    assert len(rows) == 2
    ping, note = rows  # newest first
    assert "ping" in ping and "no, buffered" in ping and "nobody waits for this" in ping
    assert "note-1" in note and re.search(r"by step #\d+", note)
    assert "&quot;text&quot;: &quot;first&quot;" in note

    updates = section(html, "weft-updates")
    (row,) = re.findall(r'<tr class="weft-update-row".*?</tr>', updates, re.S)
    assert 'data-update-id="notes-1"' in row and "<td>completed</td>" in row
    assert "&quot;text&quot;: &quot;first&quot;" in row  # the handler's result: the notes so far

    timers = section(html, "weft-timers")
    (row,) = re.findall(r'<tr class="weft-timer-row">.*?</tr>', timers, re.S)
    assert "<td>sleep</td>" in row and "<td>not yet</td>" in row and "step #" in row


def test_a_failed_update_shows_its_error(admin_client_: Client) -> None:
    handle = client.start("tests.m.cart", args=["tables-2"], id="tables-2")
    park(handle.run_id)
    with pytest.raises(UpdateTimeout):
        handle.update("broken", update_id="broken-1", wait=0)
    make_engine("second").run_turn(handle.run_id)
    with pytest.raises(UpdateFailed):
        handle.update_result("broken-1")

    html = admin_client_.get(change_url(WorkflowRun.objects.get(pk=handle.run_id))).content.decode()
    (row,) = re.findall(r'<tr class="weft-update-row".*?</tr>', section(html, "weft-updates"), re.S)
    assert "<td>failed</td>" in row and "ZeroDivisionError: division by zero" in row


def test_a_run_without_messages_shows_no_empty_tables(admin_client_: Client) -> None:
    run = make_run("quiet-1")
    html = admin_client_.get(change_url(run)).content.decode()
    assert 'id="weft-timeline"' in html
    for empty in ("weft-signals", "weft-updates", "weft-timers", "weft-family", "weft-search-attributes"):
        assert f'id="{empty}"' not in html


def test_long_lists_show_the_latest_fifty_with_the_count(admin_client_: Client) -> None:
    run = make_run("chatty-1", status="waiting")
    Signal.objects.bulk_create(Signal(run=run, name="tick", payload=i) for i in range(60))
    html = admin_client_.get(change_url(run)).content.decode()
    signals = section(html, "weft-signals")
    assert "Signals (the latest 50 of 60)" in signals
    shown = [int(n) for n in re.findall(r'<tr class="weft-signal-row" data-sequence="(\d+)"', signals)]
    newest = list(Signal.objects.filter(run=run).order_by("-id").values_list("pk", flat=True)[:50])
    assert shown == newest


def test_a_long_payload_is_cut(admin_client_: Client) -> None:
    run = make_run("big-1", status="waiting")
    Signal.objects.create(run=run, name="blob", payload="x" * 10_000)
    html = admin_client_.get(change_url(run)).content.decode()
    signals = section(html, "weft-signals")
    assert "x" * 10_000 not in signals
    assert "(10,002 characters in all)" in signals


def test_the_read_functions_count_only_a_full_list() -> None:
    run = make_run("count-1", status="waiting")
    Signal.objects.bulk_create(Signal(run=run, name="tick", payload=i) for i in range(5))
    few = runtime.read_signals(run, limit=10)
    assert (len(few.rows), few.total, few.more) == (5, 5, False)
    cut = runtime.read_signals(run, limit=3)
    assert (len(cut.rows), cut.total, cut.more) == (3, 5, True)
    assert [signal.payload for signal in cut.rows] == [4, 3, 2]
    assert runtime.read_updates(run).total == 0
    assert runtime.read_timers(run).rows == []
