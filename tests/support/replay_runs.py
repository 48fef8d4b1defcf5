"""Stored runs for the replay tests, made by running the workflows of
``tests/testapp/replay_workflows.py`` for real (in this process, on the test database)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.apps import apps

from django_weft import client
from django_weft.engine.executor import TurnOutcome
from django_weft.models import WorkflowRun
from django_weft.testing import drive, make_engine
from tests.support.driver import Driver
from tests.testapp import replay_workflows


def every_row() -> dict[str, list[dict[str, Any]]]:
    """Every row of every django_weft table and of the test app's (activities write there)."""
    tables: dict[str, list[dict[str, Any]]] = {}
    for label in ("django_weft", "testapp"):
        for model in apps.get_app_config(label).get_models():
            tables[model._meta.db_table] = list(model.objects.order_by("pk").values())
    return tables


def turn(run_id: str) -> TurnOutcome:
    return make_engine().run_turn(run_id)


def wait_until_waiting_on(run_id: str, kind: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        run = WorkflowRun.objects.get(pk=run_id)
        if run.status == "waiting" and (run.waiting_on or {}).get("kind") == kind:
            return
        assert time.monotonic() < deadline, f"run {run_id} is {run.status}, waiting on {run.waiting_on}"
        time.sleep(0.02)


def held_run(key: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A run that failed with non-determinism: parked by the original code, then woken
    under the reordered code."""
    handle = client.start("tests.replay.order", args=[key])
    assert turn(handle.run_id) == TurnOutcome.PARKED
    with monkeypatch.context() as patch:
        patch.setattr(replay_workflows, "VARIANT", "reordered")
        handle.signal("ship")
        assert turn(handle.run_id) == TurnOutcome.FAILED
    assert WorkflowRun.objects.get(pk=handle.run_id).failure_category == "nondeterminism"
    return handle.run_id


def order_runs(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Runs of ``tests.replay.order`` in every state that matters, by name: finished,
    waiting (for its signal), running (signalled, its next turn not taken yet), fresh
    (started, no step recorded) and held (failed for non-determinism)."""
    runs = {}
    finished = client.start("tests.replay.order", args=["finished"], kwargs={"wait": False})
    assert drive(finished.run_id) == "completed"
    runs["finished"] = finished.run_id
    waiting = client.start("tests.replay.order", args=["waiting"])
    assert turn(waiting.run_id) == TurnOutcome.PARKED
    runs["waiting"] = waiting.run_id
    running = client.start("tests.replay.order", args=["running"])
    assert turn(running.run_id) == TurnOutcome.PARKED
    running.signal("ship")
    assert running.status() == "running"
    runs["running"] = running.run_id
    runs["fresh"] = client.start("tests.replay.order", args=["fresh"]).run_id
    runs["held"] = held_run("held", monkeypatch)
    return runs


def handlers_run() -> str:
    """A run that applied signal and update handlers (one running an activity) while it
    waited for a condition, recorded values and search attributes, and now sleeps.

    Made with a driver thread, which drives every runnable run: make it before runs that
    must stay where they are."""
    driver = Driver("replay-handlers")
    try:
        handle = client.start("tests.replay.handlers", args=["h"])
        handle.signal("item", "apple")
        handle.signal("item", "pear")
        assert handle.update("address", {"city": " oslo "}, wait=20) == {"city": "Oslo"}
        assert handle.update("close", None, wait=20) is True
        wait_until_waiting_on(handle.run_id, "sleep")
    finally:
        driver.stop()
    return handle.run_id


def cancelled_parent_run() -> tuple[str, str]:
    """A parent run (patch marker, child, sleep) that received a cancellation request
    while it slept, ran its clean-up and ended cancelled; returns its id and its child's."""
    driver = Driver("replay-parent")
    try:
        handle = client.start("tests.replay.parent", args=["p"])
        wait_until_waiting_on(handle.run_id, "sleep")
        handle.cancel("no longer needed", mode="request")
        deadline = time.monotonic() + 20
        while handle.status() != "cancelled":
            assert time.monotonic() < deadline, handle.status()
            time.sleep(0.02)
    finally:
        driver.stop()
    history = handle.history()
    assert [e["kind"] for e in history] == ["patch", "child", "sleep", "cancel_request", "activity"]
    return handle.run_id, str(history[1]["result"]["run_id"])
