"""The other spans: an update's sender linked from the turn that applies it, a durable
timer fired by the sweep, a schedule's fire and the start it makes, and a deposed
writer's turn and attempt (docs/how-to/observe.md)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_weft import client
from django_weft.engine.errors import WorkflowTerminalError
from django_weft.engine.executor import TurnOutcome
from django_weft.runtime import tick
from django_weft.runtime.dispatch import SweepOnlyDispatcher
from django_weft.runtime.messages import accept_update
from django_weft.runtime.schedules.firing import trigger_schedule
from django_weft.testing import make_engine
from tests.support.driver import depose_by_takeover
from tests.support.tracing import span_record

pytestmark = pytest.mark.django_db(transaction=True)


def records(exporter: InMemorySpanExporter, prefix: str = "") -> list[dict[str, Any]]:
    found = [span_record(span) for span in exporter.get_finished_spans()]
    return [span for span in found if span["name"].startswith(prefix)]


def test_the_turn_applying_an_update_links_to_its_sender(spans: InMemorySpanExporter) -> None:
    handle = client.start("tests.m.sleep_with_handlers", args=[30])
    engine = make_engine()
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED
    with trace.get_tracer("tests").start_as_current_span("sender"):
        accept_update(handle.run_id, "notes", None)
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED  # applied, back to its sleep

    (sent,) = records(spans, "weft.update ")
    (sender,) = records(spans, "sender")
    assert sent["name"] == "weft.update notes" and sent["parent_id"] == sender["span_id"]
    assert sent["attributes"]["weft.run_id"] == handle.run_id
    turns = records(spans, "weft.turn ")
    assert [len(turn["links"]) for turn in turns] == [0, 1]
    assert turns[1]["links"] == [sent["span_id"]]
    assert sent["trace_id"] != turns[1]["trace_id"]  # linked, not a parent: two traces


def test_a_signal_to_a_finished_run_is_an_error_span_that_names_the_run(spans: InMemorySpanExporter) -> None:
    handle = client.start("tests.echo", args=[1])
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    with pytest.raises(WorkflowTerminalError):
        handle.signal("x")
    (refused,) = records(spans, "weft.signal ")
    assert refused["attributes"]["weft.run_id"] == handle.run_id
    assert refused["attributes"]["weft.workflow"] == "tests.echo"
    assert refused["status"] == "ERROR"


def test_signal_with_start_reports_its_signal_under_its_start(spans: InMemorySpanExporter) -> None:
    with trace.get_tracer("tests").start_as_current_span("request"):
        handle = client.signal_with_start(
            "tests.m.collect", args=["x", 1], id="sws-traced", signal="x", payload=1
        )
    (start,) = records(spans, "weft.start ")
    (sent,) = records(spans, "weft.signal ")
    assert sent["name"] == "weft.signal x" and sent["parent_id"] == start["span_id"]
    assert sent["attributes"]["weft.run_id"] == handle.run_id
    assert sent["attributes"]["weft.outcome"] == "stored"
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.COMPLETED
    (turn,) = records(spans, "weft.turn ")
    assert turn["parent_id"] == start["span_id"]
    assert turn["links"] == [sent["span_id"]]  # the turn that consumed it links to its sender


def test_a_timer_fired_by_the_sweep_is_a_span_from_its_due_time_in_its_runs_trace(
    spans: InMemorySpanExporter,
) -> None:
    with trace.get_tracer("tests").start_as_current_span("request"):
        handle = client.start("tests.traced", args=["tm"], kwargs={"sleep": 0.05})
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    time.sleep(0.1)
    tick(SweepOnlyDispatcher())
    (timer,) = records(spans, "weft.timer")
    assert timer["attributes"]["weft.run_id"] == handle.run_id
    assert timer["attributes"]["weft.timer.kind"] == "sleep"
    assert timer["attributes"]["weft.seq"] == 2
    # In the run's trace: a child of its start, as the turns are (the sweep's thread has no span).
    (start,) = records(spans, "weft.start ")
    assert (timer["trace_id"], timer["parent_id"]) == (start["trace_id"], start["span_id"])


def test_a_schedule_fire_is_a_span_and_its_run_starts_under_it(spans: InMemorySpanExporter) -> None:
    client.create_schedule("traced-hourly", "tests.obs.plain", args=[1], every="1h")
    spans.clear()
    trigger_schedule("traced-hourly")
    (fire,) = records(spans, "weft.schedule.fire")
    assert fire["attributes"]["weft.schedule_id"] == "traced-hourly"
    assert fire["attributes"]["weft.outcome"] == "started"
    run_id = fire["attributes"]["weft.run_id"]
    (start,) = records(spans, "weft.start ")
    assert start["attributes"]["weft.run_id"] == run_id
    assert start["parent_id"] == fire["span_id"] and start["trace_id"] == fire["trace_id"]

    # A fire that starts nothing (the run is still open: skipped) is a span of its own.
    spans.clear()
    trigger_schedule("traced-hourly", overlap="skip")
    (skipped,) = records(spans)
    assert skipped["name"] == "weft.schedule.fire" and skipped["parent_id"] is None
    assert skipped["attributes"]["weft.outcome"] == "skipped"


@pytest.mark.postgres
def test_a_deposed_writers_spans_say_so(spans: InMemorySpanExporter) -> None:
    """Engine A stalls after an activity; B takes the run over and completes it; A's write
    is refused (docs/explanation/guarantees.md)."""
    handle = client.start("tests.fence_probe", args=["traced"])
    assert depose_by_takeover(handle.run_id, "trace-A", "trace-B") == (
        TurnOutcome.DEPOSED,
        TurnOutcome.COMPLETED,
    )

    turns = {turn["attributes"]["weft.epoch"]: turn for turn in records(spans, "weft.turn ")}
    assert turns[1]["attributes"]["weft.deposed"] is True
    assert turns[1]["status"] == "ERROR" and "deposed" in turns[1]["status_description"]
    assert turns[1]["attributes"]["weft.takeover"] is False
    assert turns[2]["attributes"]["weft.takeover"] is True
    assert "weft.deposed" not in turns[2]["attributes"]
    # A's attempts ran to their end; the write refused (its record of position 1, held
    # back until the turn's next operation) is the turn's, whose span says so above.
    stale = [span for span in records(spans, "weft.activity ") if span["attributes"]["weft.epoch"] == 1]
    assert sorted(span["attributes"]["weft.seq"] for span in stale) == [0, 1]
    assert not any(span["attributes"].get("weft.deposed") for span in stale)


def test_a_childs_turns_descend_from_the_parents_turn_that_started_it(spans: InMemorySpanExporter) -> None:
    from django_weft.models import WorkflowRun
    from django_weft.testing import drive

    with trace.get_tracer("tests").start_as_current_span("request"):
        handle = client.start("tests.c.parent", args=["tc"], kwargs={"seconds": 0})
    engine = make_engine()
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED  # the child is started
    (child,) = WorkflowRun.objects.filter(parent_id=handle.run_id)
    assert drive(str(child.pk), engine=engine) == "completed"
    assert drive(handle.run_id, engine=engine) == "completed"

    found = records(spans)
    by_id = {span["span_id"]: span for span in found}
    (request,) = records(spans, "request")
    parent_turn = next(
        span for span in records(spans, "weft.turn tests.c.parent") if span["attributes"]["weft.epoch"] == 1
    )
    child_turns = records(spans, "weft.turn tests.c.child")
    assert child_turns
    for turn in child_turns:
        assert turn["parent_id"] == parent_turn["span_id"]
        assert turn["trace_id"] == request["trace_id"]
    assert by_id[parent_turn["parent_id"]]["name"] == "weft.start tests.c.parent"
