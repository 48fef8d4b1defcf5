"""What a parked run waits on, in words: the shapes the engine parks with. No database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
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


def test_a_debounced_run_says_when_it_starts_to_the_second_in_the_viewers_zone() -> None:
    waiting_on = {
        "kind": "debounce",
        "key": "products",
        "starts_at": "2026-12-03T14:05:07+00:00",
        "starts": 3,
    }
    assert words(waiting_on) == "debounced: starts at 14:05:07 (3 starts collapsed)"
    assert (
        describe_wait(waiting_on, tz=timezone(timedelta(hours=1)), today=TODAY)
        == "debounced: starts at 15:05:07 (3 starts collapsed)"
    )
    tomorrow = {**waiting_on, "starts_at": "2026-12-04T00:00:01+00:00", "starts": 1}
    assert words(tomorrow) == "debounced: starts at 2026-12-04 00:00:01 (1 start)"


def test_activities_held_by_flow_control_say_why_in_the_sites_time_zone() -> None:
    from datetime import timedelta, timezone

    oslo = timezone(timedelta(hours=1))
    rate = {"kind": "rate_limit", "seq": 3, "activity": "shop.charge", "name": "stripe", "key": "acct-1",
            "fire_at": "2026-12-03T14:05:01.250000+00:00", "until": "2026-12-03T14:05:01.250000+00:00",
            "text": "delayed by rate limit stripe key acct-1 until 14:05:01.250"}  # fmt: skip
    assert words(rate) == "shop.charge: delayed by rate limit stripe key acct-1 until 14:05:01.250"
    assert (
        describe_wait(rate, tz=oslo)
        == "shop.charge: delayed by rate limit stripe key acct-1 until 15:05:01.250"
    )
    slots = {"kind": "activity_concurrency", "seq": 5, "activity": "shop.render", "key": "", "limit": 8,
             "in_use": 8, "text": "queued: activity concurrency shop.render (8 of 8 in use)"}  # fmt: skip
    assert words(slots) == "queued: activity concurrency shop.render (8 of 8 in use)"
    held = step(4, "activity", "shop.charge", {"kind": "rate_limit", "name": "stripe", "key": "",
                                                "until": "2026-12-03T14:05:01.250000+00:00"})  # fmt: skip
    waiting_on = {"kind": "activities", "mode": "all", "seqs": [4],
                  "held": {"4": "delayed by rate limit stripe until 14:05:01.250"}}  # fmt: skip
    assert describe_wait(waiting_on, steps={4: held}, queue_of={"shop.charge": "payments"}.get, tz=oslo) == (
        "activity shop.charge on payments (delayed by rate limit stripe until 15:05:01.250)"
    )
