"""What a parked run waits on, in words: the shapes the engine parks with. No database."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django_weft.admin.runs.waits import describe_wait, waited_positions
from django_weft.runtime import HistoryEntry

TODAY = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def step(seq: int, kind: str, name: str, result: Any = None) -> HistoryEntry:
    return HistoryEntry(seq, kind, name, "scheduled", None, result, None, 1, TODAY, None)


def words(waiting_on: dict[str, Any] | None, **kwargs: Any) -> str:
    return describe_wait(waiting_on, tz=UTC, today=TODAY, **kwargs)


def test_nothing_to_wait_on() -> None:
    assert words(None) == ""
    assert words({}) == ""


def test_timers_today_show_the_time_and_other_days_the_date() -> None:
    assert words({"kind": "sleep", "seq": 2, "fire_at": "2026-12-03T14:05:00+00:00"}) == "timer 14:05"
    assert (
        words({"kind": "sleep", "seq": 2, "fire_at": "2026-12-04T14:05:00+00:00"}) == "timer 2026-12-04 14:05"
    )
    retry = {"kind": "retry", "seq": 1, "activity": "send_receipt", "fire_at": "2026-12-03T14:05:00+00:00"}
    assert words(retry) == "retry of send_receipt, timer 14:05"


def test_signals_and_conditions_name_their_messages() -> None:
    assert words({"kind": "signal", "seq": 3, "name": "approve", "signals": ["approve"]}) == "signal approve"
    timed = {"kind": "signal", "seq": 3, "name": "approve", "fire_at": "2026-12-03T14:05:00+00:00"}
    assert words(timed) == "signal approve or timer 14:05"
    condition = {"kind": "condition", "seq": 0, "signals": ["add"], "updates": ["x"]}
    assert words(condition) == "condition on signal add, update x"
    assert words({"kind": "condition", "seq": 0}) == "condition"


def test_activities_name_their_queue_and_children_their_workflow_id() -> None:
    waiting_on = {"kind": "activities", "mode": "all", "seqs": [1, 2]}
    assert waited_positions(waiting_on) == [1, 2]
    steps = {
        1: step(1, "activity", "send_receipt"),
        2: step(2, "child", "orders.ship", {"run_id": "r", "workflow_id": "order-7"}),
    }
    queues = {"send_receipt": "emails"}
    assert (
        words(waiting_on, steps=steps, queue_of=queues.get)
        == "activity send_receipt on emails and child order-7"
    )
    assert words({**waiting_on, "mode": "any"}, steps=steps, queue_of=queues.get).count(" or ") == 1


def test_many_positions_are_counted_and_unknown_ones_named_by_position() -> None:
    waiting_on = {"kind": "activities", "mode": "all", "seqs": [1, 2, 3, 4, 5]}
    assert words(waiting_on) == "step #1 and step #2 and step #3 and 2 more"
    assert waited_positions({"kind": "sleep", "seqs": [1]}) == []
