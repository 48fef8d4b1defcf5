"""Replay: recorded steps are not executed again; their results come from the history."""

from __future__ import annotations

from typing import Any

from django_weft.engine.executor import TurnOutcome
from django_weft.engine.records import RunStatus

from .conftest import Harness


def test_a_recorded_step_is_not_executed_again(weft: Harness) -> None:
    calls: list[str] = []

    def fetch(n: int) -> int:
        calls.append(f"fetch {n}")
        return n * 10

    def total(a: int) -> int:
        calls.append(f"total {a}")
        return a + 1

    @weft.workflow("replay.order")
    def order(ctx: Any, n: int) -> list[Any]:
        a = ctx.run(fetch, n)
        ctx.sleep(60)
        return [a, ctx.run(total, a), ctx.is_replaying]

    run_id = weft.store.start("replay.order", 4)
    assert weft.turn(run_id) == TurnOutcome.PARKED
    assert calls == ["fetch 4"]

    weft.store.advance(61)
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert calls == ["fetch 4", "total 40"]  # fetch came back from the history
    run = weft.store.runs[run_id]
    assert (run.status, run.result) == (RunStatus.COMPLETED, [40, 41, False])
    assert [(seq, kind, status) for seq, kind, _, status in weft.history(run_id)] == [
        (0, "activity", "completed"),
        (1, "sleep", "completed"),
        (2, "activity", "completed"),
    ]


def test_recorded_values_replay_the_same(weft: Harness) -> None:
    seen: list[Any] = []

    @weft.workflow("replay.values")
    def values(ctx: Any) -> None:
        seen.append((ctx.uuid4(), ctx.random(), ctx.now(), ctx.side_effect(lambda: len(seen), name="n")))
        ctx.sleep(5)

    run_id = weft.store.start("replay.values")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.advance(6)  # timers are set from the claim time plus the turn's run time
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert len(seen) == 2 and seen[0] == seen[1]


def test_a_parked_run_is_not_claimed_before_its_timer_is_due(weft: Harness) -> None:
    @weft.workflow("replay.sleeper")
    def sleeper(ctx: Any) -> str:
        ctx.sleep("1h")
        return "awake"

    run_id = weft.store.start("replay.sleeper")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    assert weft.turn(run_id) == TurnOutcome.NOT_CLAIMED
    weft.store.advance(3601)
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == "awake"
