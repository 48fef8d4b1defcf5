"""wait_all and wait_any over queued activities and child workflows."""

from __future__ import annotations

from typing import Any

import pytest

from django_weft.engine.errors import ActivityFailed, ChildWorkflowFailed
from django_weft.engine.executor import TurnOutcome
from django_weft.engine.registry import Activity

from .conftest import Harness


def _lookup(n: int) -> int:
    raise AssertionError("a queued activity runs on a worker, not in the turn")


lookup = Activity(fn=_lookup, name="waits.lookup", queue="io")


def test_wait_any_records_which_finished_first_and_wait_all_collects(weft: Harness) -> None:
    @weft.workflow("waits.race")
    def race(ctx: Any) -> list[Any]:
        handles = [ctx.start(lookup, 1), ctx.start(lookup, 2)]
        first = ctx.wait_any(handles)
        return [first.seq, ctx.wait_all(handles)]

    run_id = weft.store.start("waits.race")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    assert [(seq, queue) for _, seq, _, queue in weft.dispatcher.activities] == [(0, "io"), (1, "io")]

    assert weft.store.finish_activity(run_id, 1, result=20)  # wakes the run: it waits for any
    assert weft.turn(run_id) == TurnOutcome.PARKED  # wait_any returned; wait_all waits for 0
    assert weft.step(run_id, 2).result == {"index": 1, "seq": 1}

    assert weft.store.finish_activity(run_id, 0, result=10)
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == [1, [10, 20]]


def test_wait_all_raises_the_first_failure_after_all_finished(weft: Harness) -> None:
    @weft.workflow("waits.all_or_nothing")
    def all_or_nothing(ctx: Any) -> str:
        handles = [ctx.start(lookup, 1), ctx.start(lookup, 2)]
        try:
            ctx.wait_all(handles)
        except ActivityFailed as exc:
            return f"{exc.seq}: {exc.cause_message}"
        return "ok"

    run_id = weft.store.start("waits.all_or_nothing")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.finish_activity(run_id, 1, error=KeyError("gone"))
    assert weft.turn(run_id) == TurnOutcome.PARKED  # the failure is decided (no retries left)
    assert weft.step(run_id, 1).status == "failed"
    assert weft.store.finish_activity(run_id, 0, result=10)
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == "1: 'gone'"


def test_children_are_waited_for_and_wake_their_parent(weft: Harness) -> None:
    @weft.workflow("waits.child")
    def child(ctx: Any, n: int) -> int:
        if n < 0:
            raise ValueError("negative")
        return n * n

    @weft.workflow("waits.parent")
    def parent(ctx: Any) -> list[Any]:
        handles = [ctx.start_child("waits.child", 3), ctx.start_child("waits.child", -1)]
        done = ctx.wait_any(handles)
        try:
            ctx.wait_all(handles)
        except ChildWorkflowFailed as exc:
            return [done.seq, exc.status, exc.error_message]
        return [done.seq]

    run_id = weft.store.start("waits.parent", workflow_id="order-7")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    children = [r for r in weft.store.runs.values() if r.parent_run_id == run_id]
    assert [c.workflow_id for c in children] == ["order-7:0", "order-7:1"]

    assert weft.turn(children[1].run_id) == TurnOutcome.FAILED
    assert (run_id, None) in weft.dispatcher.turns  # the failed child rang its parent's doorbell
    assert weft.turn(run_id) == TurnOutcome.PARKED  # wait_any: child 1; wait_all: child 0
    assert weft.turn(children[0].run_id) == TurnOutcome.COMPLETED
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == [1, "failed", "negative"]


def test_handles_of_another_run_are_refused(weft: Harness) -> None:
    stolen: list[Any] = []

    @weft.workflow("waits.thief")
    def thief(ctx: Any) -> None:
        if stolen:
            ctx.wait_all(stolen)
        stolen.append(ctx.start(lookup, 1))

    weft.turn(weft.store.start("waits.thief"))
    victim = weft.store.start("waits.thief")
    assert weft.turn(victim) == TurnOutcome.FAILED
    error = weft.store.runs[victim].error
    assert error is not None and "takes handles returned by ctx.start" in error["message"]


@pytest.mark.parametrize("wait", ["wait_all", "wait_any"])
def test_inline_handles_are_finished_at_once(weft: Harness, wait: str) -> None:
    @weft.workflow("waits.inline")
    def inline(ctx: Any) -> Any:
        handles = [ctx.start(lambda: 1), ctx.start(lambda: 2)]
        outcome = getattr(ctx, wait)(handles)
        return outcome if wait == "wait_all" else outcome.seq

    run_id = weft.store.start("waits.inline")
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == ([1, 2] if wait == "wait_all" else 0)
