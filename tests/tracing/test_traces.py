"""Traces of runs worked in this process: the spans, their parents and attributes, and
none for what a turn replays from its record (docs/how-to/observe.md#traces-opentelemetry)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_weft import client
from django_weft.models import WorkflowRun
from django_weft.testing.helpers import drive, make_engine, run_queued_activities
from tests.support.tracing import span_record

pytestmark = pytest.mark.django_db(transaction=True)


def records(exporter: InMemorySpanExporter) -> list[dict[str, Any]]:
    return [span_record(span) for span in exporter.get_finished_spans()]


def named(spans: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [span for span in spans if span["name"].startswith(prefix)]


def ancestors(span: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> list[str]:
    chain = []
    while span["parent_id"] is not None and span["parent_id"] in by_id:
        span = by_id[span["parent_id"]]
        chain.append(span["name"])
    return chain


def test_a_run_is_one_trace_under_its_start_and_replayed_steps_emit_nothing(
    spans: InMemorySpanExporter,
) -> None:
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("request"):
        handle = client.start("tests.traced", args=["tr1"], kwargs={"sleep": 0.1})
    engine = make_engine()
    engine.run_turn(handle.run_id)  # step 1, the flaky activity (two attempts), the sleep
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "waiting"
    with tracer.start_as_current_span("sender"):
        handle.signal("go", {"ok": True})
    assert drive(handle.run_id, engine=engine) == "completed"
    assert handle.result(timeout=5) == {"steps": [1, 2, 3], "signal": {"ok": True}}

    found = records(spans)
    by_id = {span["span_id"]: span for span in found}
    request = next(span for span in found if span["name"] == "request")
    (start,) = named(found, "weft.start ")
    assert start["name"] == "weft.start tests.traced"
    assert start["parent_id"] == request["span_id"]
    assert start["attributes"]["weft.run_id"] == handle.run_id
    assert start["attributes"]["weft.workflow"] == "tests.traced"

    turns = named(found, "weft.turn ")
    assert len(turns) >= 2  # the first, and at least the one after the signal
    for turn in turns:
        assert turn["name"] == "weft.turn tests.traced"
        assert turn["parent_id"] == start["span_id"]
        assert turn["trace_id"] == request["trace_id"]
        assert turn["attributes"]["weft.run_id"] == handle.run_id
        assert turn["attributes"]["weft.workflow_id"] == handle.workflow_id
        assert turn["attributes"]["weft.epoch"] >= 1
    assert turns[-1]["attributes"]["weft.outcome"] == "completed"

    activities = named(found, "weft.activity ")
    # One span per attempt that really ran: step 1, the flaky activity's two attempts and
    # step 3. The turns after the first replayed steps 1 and 2 from their records: no span.
    assert [(span["name"], span["attributes"]["weft.seq"], span["attributes"]["weft.attempt"])
            for span in activities] == [
        ("weft.activity tests.traced.step", 0, 1),
        ("weft.activity tests.traced.flaky", 1, 1),
        ("weft.activity tests.traced.flaky", 1, 2),
        ("weft.activity tests.traced.step", 4, 1),
    ]  # fmt: skip
    turn_ids = {turn["span_id"] for turn in turns}
    for span in activities:
        assert span["parent_id"] in turn_ids
        assert ancestors(span, by_id)[-1] == "request"
        assert span["attributes"]["weft.run_id"] == handle.run_id
    failed, retried = activities[1], activities[2]
    assert failed["status"] == "ERROR" and "RuntimeError" in failed["status_description"]
    assert "exception" in failed["events"]
    assert retried["status"] == "UNSET"
    assert {activities[0]["parent_id"], failed["parent_id"], retried["parent_id"]} == {turns[0]["span_id"]}

    # The signal: the sender's span is its parent, and the turn that consumed it links to it.
    (signal,) = named(found, "weft.signal ")
    assert signal["name"] == "weft.signal go"
    assert by_id[signal["parent_id"]]["name"] == "sender"
    assert signal["attributes"]["weft.run_id"] == handle.run_id
    assert [turn for turn in turns if signal["span_id"] in turn["links"]]


def test_a_queued_attempt_is_a_child_of_the_start(spans: InMemorySpanExporter) -> None:
    with trace.get_tracer("tests").start_as_current_span("request"):
        handle = client.start("tests.traced_queued", args=["tr2"])
    engine = make_engine()
    engine.run_turn(handle.run_id)
    assert run_queued_activities(handle.run_id) == 1
    assert drive(handle.run_id, engine=engine) == "completed"

    found = records(spans)
    (start,) = named(found, "weft.start ")
    (attempt,) = named(found, "weft.activity ")
    assert attempt["name"] == "weft.activity tests.traced.queued"
    assert attempt["parent_id"] == start["span_id"]
    assert attempt["attributes"]["weft.queue"] == "tests"
    assert attempt["attributes"]["weft.attempt"] == 1
    assert attempt["attributes"]["weft.outcome"] == "completed"


def test_a_query_is_a_span_of_the_caller(spans: InMemorySpanExporter) -> None:
    handle = client.start("tests.traced", args=["tr3"], kwargs={"sleep": 0.1})
    make_engine().run_turn(handle.run_id)
    spans.clear()
    with pytest.raises(Exception):  # noqa: B017 - the workflow registers no query handler
        handle.query("state")
    (query,) = named(records(spans), "weft.query ")
    assert query["name"] == "weft.query state"
    assert query["status"] == "ERROR"


def test_an_untraced_start_stores_no_context(spans: InMemorySpanExporter) -> None:
    from django_weft import tracing

    tracing.uninstall()
    handle = client.start("tests.traced_queued", args=["tr4"])
    assert WorkflowRun.objects.get(pk=handle.run_id).trace_context is None


def test_a_run_started_in_an_unsampled_trace_records_no_span_on_any_turn(spans: InMemorySpanExporter) -> None:
    # The caller's trace was not sampled (flags 00): the SDK's default sampler follows the
    # parent, and the run's stored context carries that decision to every later turn,
    # attempt and timer, on whatever worker.
    unsampled = trace.NonRecordingSpan(
        trace.SpanContext(trace_id=0x1234, span_id=0x5678, is_remote=True, trace_flags=trace.TraceFlags(0))
    )
    with trace.use_span(unsampled):
        handle = client.start("tests.traced", args=["unsampled"], kwargs={"sleep": 0.05})
        handle.signal("go", 1)
    carrier = WorkflowRun.objects.get(pk=handle.run_id).trace_context
    assert carrier["traceparent"].endswith("-00")  # stored, with the decision
    assert drive(handle.run_id) == "completed"  # through its sleep: several turns
    assert records(spans) == []
