"""Debounced starts decided in the database: starts of a key collapse into one pending
run that starts a period after the last of them, with its arguments, within max_wait of
the first; on the virtual clock, then on real time with threads. On both databases."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_weft import InvalidInput, WorkflowAlreadyExists, client, runtime
from django_weft.client import WorkflowHandle
from django_weft.models import Signal, Timer, WorkflowRun
from tests.support.driver import Driver
from tests.support.threads import in_threads
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)
REINDEX = "tests.debounce.reindex"  # Debounce(period="30s", max_wait="5m", key=index)


def runs(workflow: str = REINDEX) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(workflow_name=workflow).order_by("created_at"))


def row(handle: WorkflowHandle) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=handle.run_id)


def delayed_start(handle: WorkflowHandle) -> Timer:
    return Timer.objects.get(run_id=handle.run_id, kind="delayed_start")


def marks() -> list[str]:
    return sorted(SideEffect.objects.values_list("key", flat=True))


# -- on the virtual clock ---------------------------------------------------------------------


def test_twenty_starts_100_ms_apart_are_one_run_with_the_last_arguments_a_period_after_the_last(
    weft: Any,
) -> None:
    handles = []
    for n in range(20):
        handles.append(client.start(REINDEX, args=["products"], kwargs={"n": n}))
        last = weft.now()
        weft.advance(0.1)
    assert {handle.run_id for handle in handles} == {handles[0].run_id}
    assert {handle.workflow_id for handle in handles} == {handles[0].workflow_id}
    pending = row(handles[0])
    assert (pending.status, pending.debounce_key, pending.debounced_starts) == ("pending", "products", 20)
    assert (pending.args, pending.kwargs) == (["products"], {"n": 19})
    starts_at = last + 30 * SECOND
    assert delayed_start(handles[0]).fire_at == starts_at
    assert pending.waiting_on["kind"] == "debounce"
    assert pending.waiting_on["starts"] == 20
    assert pending.waiting_on["text"] == f"debounced: starts at {starts_at:%H:%M:%S} (20 starts collapsed)"
    weft.advance("29.8s")  # 29.9 s after the last start
    assert row(handles[0]).status == "pending"
    weft.advance("0.1s")
    started = row(handles[0])
    assert started.status == "completed"
    assert started.claimed_at == starts_at
    assert started.result == {"index": "products", "n": 19}
    assert started.waiting_on is None
    assert started.debounced_starts == 20  # kept after it ran
    assert marks() == ["reindex:products:19"]
    assert len(runs()) == 1


def test_a_stream_that_never_pauses_starts_once_at_max_wait_and_the_rest_opens_the_next_burst(
    weft: Any,
) -> None:
    first = weft.now()
    returned: dict[str, int] = {}
    for n in range(36):  # every 10 s for 6 minutes: never a 30 s pause
        returned[client.start(REINDEX, args=["products"], kwargs={"n": n}).run_id] = n
        weft.advance(10)
    one, two = runs()
    assert (one.status, one.claimed_at) == ("completed", first + timedelta(minutes=5))
    # The last start before its time came (at 290 s) gave it its arguments; the start at
    # 300 s came when it was due, and opened the next burst.
    assert (one.result, one.debounced_starts, returned[str(one.pk)]) == (
        {"index": "products", "n": 29},
        30,
        29,
    )
    assert (two.status, two.kwargs, two.debounced_starts) == ("pending", {"n": 35}, 6)
    assert returned[str(two.pk)] == 35
    assert Timer.objects.get(run=two, kind="delayed_start").fire_at == first + timedelta(seconds=380)
    weft.advance(20)
    assert runs()[1].status == "completed"
    assert marks() == ["reindex:products:29", "reindex:products:35"]


def test_each_key_has_its_own_burst_and_no_key_makes_one_burst_for_the_workflow(weft: Any) -> None:
    products = client.start(REINDEX, args=["products"])
    orders = client.start(REINDEX, args=["orders"], kwargs={"n": 1})
    assert products.run_id != orders.run_id
    assert client.start(REINDEX, args=["orders"], kwargs={"n": 2}).run_id == orders.run_id
    whole = [client.start("tests.debounce.whole", kwargs={"n": n}) for n in range(3)]
    assert {handle.run_id for handle in whole} == {whole[0].run_id}
    assert row(whole[0]).debounce_key == ""
    weft.advance("30s")
    assert marks() == ["reindex:orders:2", "reindex:products:0"]
    assert row(whole[0]).status == "pending"  # a minute's period, no cap
    weft.advance("30s")
    assert whole[0].result() == 2


def test_once_the_run_started_a_new_start_opens_a_new_burst(weft: Any) -> None:
    first = client.start(REINDEX, args=["products"], kwargs={"n": 1})
    weft.advance("30s")
    assert row(first).status == "completed"
    second = client.start(REINDEX, args=["products"], kwargs={"n": 2})
    assert second.run_id != first.run_id
    assert (row(second).status, row(second).debounced_starts) == ("pending", 1)
    assert row(second).waiting_on["text"].endswith("(1 start)")


def test_a_burst_cancelled_while_pending_ends_and_the_next_start_opens_another(weft: Any) -> None:
    first = client.start(REINDEX, args=["products"], kwargs={"n": 1})
    first.cancel(reason="not needed")
    second = client.start(REINDEX, args=["products"], kwargs={"n": 2})
    assert second.run_id != first.run_id
    assert (row(first).status, row(second).status) == ("cancelled", "pending")
    weft.advance("30s")
    assert marks() == ["reindex:products:2"]


def test_a_start_after_the_burst_came_due_but_before_the_sweep_fired_it_does_not_join_it(
    weft: Any,
) -> None:
    first = client.start(REINDEX, args=["products"], kwargs={"n": 1})
    weft.clock.advance(31)  # no sweep in between
    second = client.start(REINDEX, args=["products"], kwargs={"n": 2})
    assert second.run_id != first.run_id
    assert (row(first).status, row(first).kwargs, row(first).waiting_on) == ("running", {"n": 1}, None)
    assert row(second).status == "pending"
    weft.run_until_idle()
    assert first.result() == {"index": "products", "n": 1}
    assert row(second).status == "pending"


def test_a_start_whose_id_names_a_due_burst_gets_that_run_now_runnable(weft: Any) -> None:
    first = client.start(REINDEX, args=["products"], kwargs={"n": 1}, id="reindex-products")
    weft.clock.advance(31)  # no sweep in between
    again = client.start(REINDEX, args=["products"], kwargs={"n": 2}, id="reindex-products")
    assert again.run_id == first.run_id
    assert (row(first).status, row(first).kwargs) == ("running", {"n": 1})
    assert len(runs()) == 1


def test_the_last_start_gives_the_run_its_options_and_its_execution_deadline(weft: Any) -> None:
    first = client.start(
        REINDEX, args=["products"], search_attributes={"tenant": "a"}, priority=5, execution_timeout="1h"
    )
    weft.advance(10)
    client.start(
        REINDEX, args=["products"], search_attributes={"tenant": "b"}, priority=-3, execution_timeout="2h"
    )
    now = weft.now()
    pending = row(first)
    assert (pending.search_attributes, pending.priority) == ({"tenant": "b"}, -3)
    assert pending.execution_deadline == now + timedelta(hours=2)
    assert Timer.objects.get(run=pending, kind="deadline").fire_at == now + timedelta(hours=2)
    client.start(REINDEX, args=["products"])  # no timeout: no deadline
    assert row(first).execution_deadline is None
    assert not Timer.objects.filter(run_id=first.run_id, kind="deadline").exists()
    assert (row(first).search_attributes, row(first).priority) == ({}, 0)


def test_a_burst_longer_than_the_first_starts_timeout_is_not_timed_out_while_pending(weft: Any) -> None:
    handle = client.start(REINDEX, args=["products"], execution_timeout="40s")
    for _ in range(5):
        weft.advance(20)
        client.start(REINDEX, args=["products"], execution_timeout="40s")
    weft.advance(30)
    assert handle.result() == {"index": "products", "n": 0}


def test_with_an_id_the_id_names_the_burst_its_first_start_opens(weft: Any) -> None:
    opened = client.start(REINDEX, args=["products"], id="reindex-products")
    assert opened.workflow_id == "reindex-products"
    again = client.start(REINDEX, args=["products"], kwargs={"n": 1}, id="reindex-products")
    plain = client.start(REINDEX, args=["products"], kwargs={"n": 2})
    other = client.start(REINDEX, args=["products"], kwargs={"n": 3}, id="another-id")
    assert {h.run_id for h in (again, plain, other)} == {opened.run_id}
    assert {h.workflow_id for h in (again, plain, other)} == {"reindex-products"}
    assert (row(opened).debounced_starts, row(opened).kwargs) == (4, {"n": 3})
    assert not WorkflowRun.objects.filter(workflow_id="another-id").exists()
    with pytest.raises(WorkflowAlreadyExists):
        client.start(REINDEX, args=["products"], id="reindex-products", on_conflict="fail")
    weft.advance("30s")
    assert opened.result() == {"index": "products", "n": 3}
    # A finished run keeps its id, as for any start: returned, or replaced by a new burst.
    assert client.start(REINDEX, args=["products"], id="reindex-products").run_id == opened.run_id
    renewed = client.start(
        REINDEX, args=["products"], id="reindex-products", on_conflict="start_new_if_terminal"
    )
    assert renewed.run_id != opened.run_id
    assert (row(renewed).status, row(renewed).workflow_id) == ("pending", "reindex-products")


def test_an_id_naming_another_keys_run_returns_that_run_as_any_start_would(weft: Any) -> None:
    orders = client.start(REINDEX, args=["orders"], id="shared")
    found = client.start(REINDEX, args=["products"], kwargs={"n": 9}, id="shared")
    assert found.run_id == orders.run_id
    assert (row(orders).kwargs, row(orders).debounced_starts) == ({}, 1)  # not joined
    assert not WorkflowRun.objects.filter(debounce_key="products").exists()


def test_signal_with_start_joins_the_burst_of_its_key_and_signals_its_run(weft: Any) -> None:
    opened = runtime.signal_with_start(REINDEX, ["products"], id="sws-1", signal="hello", payload=1)
    assert opened.created
    joined = runtime.signal_with_start(REINDEX, ["products"], {"n": 2}, id="sws-2", signal="hello", payload=2)
    assert (joined.run_id, joined.workflow_id, joined.created) == (opened.run_id, "sws-1", False)
    again = runtime.signal_with_start(REINDEX, ["products"], {"n": 3}, id="sws-1", signal="hello", payload=3)
    assert again.run_id == opened.run_id
    run = WorkflowRun.objects.get(pk=opened.run_id)
    # The live run of its id is signalled as it is; only a start joins.
    assert (run.kwargs, run.debounced_starts) == ({"n": 2}, 2)
    assert list(Signal.objects.filter(run=run).order_by("id").values_list("payload", flat=True)) == [1, 2, 3]


def test_a_debounced_run_of_a_limited_workflow_queues_for_a_slot_once_its_time_came(weft: Any) -> None:
    a = client.start("tests.debounce.limited", args=["a"])
    b = client.start("tests.debounce.limited", args=["b"])
    weft.advance("30s")
    holder, queued = (a, b) if row(a).slot == "held" else (b, a)
    assert row(holder).status == "waiting"
    assert (row(queued).status, row(queued).slot, row(queued).waiting_on["kind"]) == (
        "pending",
        "queued",
        "concurrency",
    )
    # The queued run started its wait for a slot: a start of its key opens a new burst.
    later = client.start("tests.debounce.limited", args=[row(queued).args[0]], kwargs={"n": 5})
    assert later.run_id != queued.run_id
    assert (row(later).status, row(later).slot) == ("pending", "")
    weft.signal(holder, "go")
    assert row(holder).status == "completed"
    assert row(queued).status == "waiting"
    weft.signal(queued, "go")
    weft.advance("30s")
    assert row(later).status == "waiting"  # it took the slot after its own period
    weft.signal(later, "go")
    assert later.result() == 5


def test_a_key_function_that_fails_or_returns_no_key_refuses_the_start_and_writes_nothing() -> None:
    with pytest.raises(
        InvalidInput, match=r"debounce key of workflow .tests\.debounce\.bad_key. could not be computed"
    ):
        client.start("tests.debounce.bad_key", args=["raise"])
    with pytest.raises(
        InvalidInput, match=r"debounce key function .* must return a str or int; it returned dict"
    ):
        client.start("tests.debounce.bad_key", args=["dict"])
    with pytest.raises(InvalidInput, match=r"debounce key of workflow .* holds a control character"):
        client.start("tests.debounce.bad_key", args=["a\x01b"])
    with pytest.raises(
        InvalidInput, match=r"is debounced: a run starts 30 s after the last start of its key"
    ):
        client.start(REINDEX, args=["products"], start_delay="1m")
    assert not WorkflowRun.objects.exists()
    assert not Timer.objects.exists()


# -- on real time ------------------------------------------------------------------------------

QUICK = "tests.debounce.quick"  # Debounce(period=1, max_wait=5, key=index)


def start_quick(n: int) -> tuple[str, datetime]:
    """Start ``tests.debounce.quick`` for index "i"; the run id and when the call began."""
    called = timezone.now()
    return client.start(QUICK, args=["i"], kwargs={"n": n}).run_id, called


@pytest.mark.django_db(transaction=True)
def test_on_real_time_twenty_starts_100_ms_apart_start_one_run_a_period_after_the_last(
    driver: Driver,
) -> None:
    returned = []
    for n in range(20):
        returned.append(start_quick(n))
        time.sleep(0.1)
    (run_id,) = {run_id for run_id, _ in returned}
    last_call = returned[-1][1]
    handle = client.get_handle(run_id)
    assert handle.result(timeout=10) == 19
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.debounced_starts == 20
    assert run.claimed_at >= last_call + SECOND
    assert run.claimed_at < last_call + 3 * SECOND, "started more than 2 s late"
    assert marks() == ["quick:i:19"]
    assert len(runs(QUICK)) == 1


@pytest.mark.django_db(transaction=True)
def test_on_real_time_a_stream_that_never_pauses_starts_once_at_max_wait(driver: Driver) -> None:
    returned = []
    stream_began = timezone.now()
    while timezone.now() < stream_began + 6 * SECOND:  # a start every 100 ms for 6 s
        returned.append(start_quick(len(returned)))
        time.sleep(0.1)
    first, *rest = runs(QUICK)
    client.get_handle(str(first.pk)).result(timeout=10)
    first.refresh_from_db()
    assert stream_began + 5 * SECOND <= first.claimed_at < stream_began + 6.5 * SECOND
    # Each run has the arguments of the last start that returned it.
    last_of = {run_id: n for n, (run_id, _) in enumerate(returned)}
    for run in [first, *rest]:
        assert run.kwargs == {"n": last_of[str(run.pk)]}
    assert len(rest) == 1, "the starts after the first run's time are one more burst"
    assert client.get_handle(str(rest[0].pk)).result(timeout=10) == len(returned) - 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_starts_from_threads_collapse_into_one_run() -> None:
    threads, each = 8, 10
    barrier = threading.Barrier(threads)

    def starts(thread: int) -> list[str]:
        barrier.wait(10)
        return [
            client.start(REINDEX, args=["products"], kwargs={"n": thread * 100 + i}).run_id
            for i in range(each)
        ]

    returned = in_threads(starts, threads)
    (run,) = runs()
    assert {run_id for ids in returned for run_id in ids} == {str(run.pk)}
    assert (run.status, run.debounced_starts) == ("pending", threads * each)
    # The last start to commit is the last start of one of the threads.
    assert run.kwargs["n"] % 100 == each - 1
    assert Timer.objects.filter(run=run, kind="delayed_start", fired_at__isnull=True).count() == 1
