"""Signal and update handlers run while the body is blocked, at recorded positions, and
are re-applied at the same positions on replay."""

from __future__ import annotations

from typing import Any

from django_weft.engine.executor import TurnOutcome

from .conftest import Harness


def test_handlers_interleave_with_a_sleep_and_replay_in_place(weft: Harness) -> None:
    executed: list[str] = []

    def price(item: str) -> int:
        executed.append(item)
        return len(item)

    @weft.workflow("handlers.cart")
    def cart(ctx: Any) -> dict[str, Any]:
        state: dict[str, Any] = {"items": [], "total": 0, "note": None}

        def add(item: str) -> None:
            state["items"].append(item)
            state["total"] += ctx.run(price, item)

        def set_note(note: str) -> str:
            state["note"] = note
            return f"noted after {len(state['items'])} item(s)"

        ctx.on_signal("add", add)
        ctx.on_update("note", set_note)
        ctx.sleep(600)
        return state

    run_id = weft.store.start("handlers.cart")
    assert weft.turn(run_id) == TurnOutcome.PARKED

    weft.store.signal(run_id, "add", "apple")  # wakes the run: it handles "add"
    assert weft.turn(run_id) == TurnOutcome.PARKED
    update_id = weft.store.update(run_id, "note", "gift")
    weft.store.signal(run_id, "add", "kiwi")
    assert weft.turn(run_id) == TurnOutcome.PARKED

    weft.store.advance(601)
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == {"items": ["apple", "kiwi"], "total": 9, "note": "gift"}
    assert executed == ["apple", "kiwi"]  # each handler's inner step ran once
    assert weft.store.update_outcome(update_id) == ("completed", "noted after 1 item(s)", None)
    priced = f"{price.__module__}.{price.__qualname__}"
    assert [(seq, kind, name) for seq, kind, name, _ in weft.history(run_id)] == [
        (0, "sleep", "sleep"),
        (1, "handler", "signal:add"),
        (2, "activity", priced),
        (3, "handler", "update:note"),
        (4, "handler", "signal:add"),
        (5, "activity", priced),
    ]


def test_a_condition_is_re_evaluated_after_each_handler(weft: Harness) -> None:
    @weft.workflow("handlers.approval")
    def approval(ctx: Any) -> list[str]:
        votes: list[str] = []
        ctx.on_signal("vote", votes.append)
        approved = ctx.wait_condition(lambda: len(votes) >= 2, timeout="1d")
        return [*votes, "approved" if approved else "expired"]

    run_id = weft.store.start("handlers.approval")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.signal(run_id, "vote", "ann")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.signal(run_id, "vote", "bob")
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == ["ann", "bob", "approved"]
    assert [kind for _, kind, _, _ in weft.history(run_id)] == ["condition", "handler", "handler"]


def test_wait_signal_consumes_buffered_signals_oldest_first(weft: Harness) -> None:
    @weft.workflow("handlers.inbox")
    def inbox(ctx: Any) -> list[Any]:
        return [ctx.wait_signal("msg"), ctx.wait_signal("msg")]

    run_id = weft.store.start("handlers.inbox")
    weft.store.signal(run_id, "msg", 1)
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.signal(run_id, "msg", 2)
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].result == [1, 2]
