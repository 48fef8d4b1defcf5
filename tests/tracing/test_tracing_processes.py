"""The acceptance test of traces across the durable gap: a run started by ``POST runs/``
(the request's span made by a stand-in for an HTTP instrumentation, in this process),
worked by ``weft_worker`` processes that export their spans to a file of the test's
(``WEFT_TEST_SPAN_FILE``, read by tests/settings.py), is one trace under the request; the
first worker is SIGKILLed after the run's second step, and the second replays those steps
without a span for them."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_weft.models import Step, WorkflowRun
from tests.api.conftest import Api, api  # noqa: F401 - the live server's API fixture
from tests.integration.conftest import start_worker, wait_for  # noqa: F401 - worker processes
from tests.support.tracing import read_span_file, span_record

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def status(run_id: str) -> str:
    return WorkflowRun.objects.get(pk=run_id).status


def test_a_rest_start_is_one_trace_across_killed_and_replaying_workers(
    spans: InMemorySpanExporter,
    api: Api,  # noqa: F811
    start_worker: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    span_file = tmp_path / "worker-spans.jsonl"
    exporting = {"WEFT_TEST_SPAN_FILE": str(span_file)}
    response = api.post("runs/", {"workflow": "tests.traced", "args": ["acc"], "kwargs": {"sleep": 0.3}})
    assert response.status_code == 201, response.content
    run_id = response.json()["run_id"]

    # The first worker runs step 1 and the flaky activity (two attempts), parks on the
    # sleep, and is killed in its next turn, about to record the signal wait (its third
    # step commit; the sleep was written with the park): that turn's span is never ended,
    # so never exported.
    first = start_worker(tick=0.2, faults="before_step_commit:kill:3", env_vars=exporting)
    assert first.wait(30) == -signal.SIGKILL
    assert list(Step.objects.filter(run_id=run_id).values_list("kind", flat=True)) == [
        "activity",
        "activity",
        "sleep",
    ]
    killed_spans = read_span_file(span_file)

    start_worker(tick=0.2, env_vars=exporting)
    wait_for(lambda: Step.objects.filter(run_id=run_id, kind="signal").exists(), 30, "the signal wait")
    assert api.post(f"runs/{run_id}/signal/", {"name": "go", "payload": 7}).status_code in (200, 201, 202)
    wait_for(lambda: status(run_id) == "completed", 30, "the run to complete")

    here = [span_record(span) for span in spans.get_finished_spans()]
    (request,) = [span for span in here if span["name"] == "POST /api/weft/runs/"]
    assert request["parent_id"] is None
    (start,) = [span for span in here if span["name"] == "weft.start tests.traced"]
    assert start["parent_id"] == request["span_id"]
    (sent,) = [span for span in here if span["name"] == "weft.signal go"]

    worker = read_span_file(span_file)
    by_id = {span["span_id"]: span for span in [*here, *worker]}
    run_spans = [span for span in worker if span["name"].startswith(("weft.turn ", "weft.activity "))]
    turns = [span for span in run_spans if span["name"].startswith("weft.turn ")]
    activities = [span for span in run_spans if span["name"].startswith("weft.activity ")]
    assert turns and activities
    dangling = set()
    for span in run_spans:
        assert span["trace_id"] == request["trace_id"], span
        chain, parent = [], span["parent_id"]
        while parent in by_id:
            chain.append(parent)
            parent = by_id[parent]["parent_id"]
        if parent is not None:
            dangling.add(parent)  # the killed worker's turn, never exported
        else:
            assert chain[-1] == request["span_id"], span
    # Only the killed turn is missing, and only the activity spans of that turn hang from it.
    assert len(dangling) <= 1
    assert {span["span_id"] for span in killed_spans} <= {span["span_id"] for span in worker}
    for turn in turns:
        assert turn["parent_id"] == start["span_id"]

    # One span per attempt that ran, none for the steps the second worker replayed.
    attempts = [(span["name"], span["attributes"]["weft.seq"], span["attributes"]["weft.attempt"])
                for span in activities]  # fmt: skip
    assert attempts == [
        ("weft.activity tests.traced.step", 0, 1),
        ("weft.activity tests.traced.flaky", 1, 1),
        ("weft.activity tests.traced.flaky", 1, 2),
        ("weft.activity tests.traced.step", 4, 1),
    ]
    assert len({span["span_id"] for span in worker}) == len(worker)  # nothing exported twice
    flaky_first = activities[1]
    assert flaky_first["status"] == "ERROR"
    # The turn that consumed the signal links to the sender's span.
    assert [turn for turn in turns if sent["span_id"] in turn["links"]]
