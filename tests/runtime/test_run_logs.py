"""Run-scoped logs: ``ctx.logger`` writes each line once however many turns replay it,
and every record about a run carries its fields in ``extra``."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from django_weft import client
from django_weft.engine.executor import TurnOutcome
from django_weft.runtime import tick
from django_weft.runtime.dispatch import SweepOnlyDispatcher
from django_weft.testing import drive, make_engine, run_queued_activities
from tests.testapp import observe_workflows

pytestmark = pytest.mark.django_db(transaction=True)

FIELDS = ("run_id", "workflow_id", "workflow", "seq", "attempt")


def fields(record: logging.LogRecord) -> dict[str, Any]:
    return {name: getattr(record, name, None) for name in FIELDS}


def test_a_workflow_replayed_five_times_writes_each_line_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="django_weft.workflow.tests.obs.logged")
    handle = client.start("tests.obs.logged", args=[5])
    assert drive(handle.run_id) == "completed"
    records = [r for r in caplog.records if r.name == "django_weft.workflow.tests.obs.logged"]
    # Six turns: the first line was replayed by five of them, and written once.
    assert [r.getMessage() for r in records] == [
        f"[tests.obs.logged {handle.workflow_id}] line {index}" for index in range(5)
    ] + [f"[tests.obs.logged {handle.workflow_id}] last line"]
    run_fields = {"run_id": handle.run_id, "workflow_id": handle.workflow_id, "workflow": "tests.obs.logged"}
    for index, record in enumerate(records):
        # Each line at the position it was written: before the index-th sleep.
        assert fields(record) == {**run_fields, "seq": index, "attempt": 1}
        assert record.weft_run_id == handle.run_id  # type: ignore[attr-defined]


def test_activity_loggers_and_the_packages_records_carry_the_runs_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="django_weft")
    observe_workflows.failures["logs"] = 1
    handle = client.start("tests.obs.steps", args=["logs"])
    engine = make_engine()
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED
    time.sleep(0.1)
    tick(SweepOnlyDispatcher())
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED
    assert run_queued_activities(handle.run_id) == 1
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED
    handle.signal("go", 1)
    assert engine.run_turn(handle.run_id) == TurnOutcome.COMPLETED
    run_fields = {"run_id": handle.run_id, "workflow_id": handle.workflow_id, "workflow": "tests.obs.steps"}

    def only(name: str, text: str) -> logging.LogRecord:
        found = [r for r in caplog.records if r.name == name and text in r.getMessage()]
        assert len(found) == 1, [r.getMessage() for r in caplog.records if r.name == name]
        return found[0]

    # An inline activity's logger: its position and its attempt (the second: the first failed).
    flaky = only("django_weft.activity.tests.obs.flaky", "flaky logs succeeded")
    assert fields(flaky) == {**run_fields, "seq": 1, "attempt": 2}
    # A queued activity's logger, on the worker that ran it.
    queued = only("django_weft.activity.tests.obs.queued", "queued logs")
    assert fields(queued) == {**run_fields, "seq": 3, "attempt": 1}
    # The runtime's record of that queued attempt, and the engine's records of the turns.
    done = only("django_weft.runtime", "activity tests.obs.queued (position 3, attempt 1): completed")
    assert fields(done) == {**run_fields, "seq": 3, "attempt": 1}
    claimed = [
        r for r in caplog.records if r.name == "django_weft.engine" and ": claimed, epoch" in r.getMessage()
    ]
    assert len(claimed) == 4
    assert all({k: v for k, v in fields(r).items() if k in run_fields} == run_fields for r in claimed)
    received = only("django_weft.runtime", "signal go received")
    assert {k: getattr(received, k, None) for k in run_fields} == run_fields
    # Every record the package wrote while the run was driven names the run.
    about_run = [
        r for r in caplog.records if r.name.startswith("django_weft") and handle.run_id in r.getMessage()
    ]
    assert about_run and all(getattr(r, "run_id", None) == handle.run_id for r in about_run), [
        (r.name, r.getMessage()) for r in about_run if getattr(r, "run_id", None) != handle.run_id
    ]
