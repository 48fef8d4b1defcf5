"""The chaos workload (autodiscovered like a user's workflows module).

An order runs an inline activity, a queued activity, an atomic ledger step, a durable
sleep, waits for its numbered signals and runs a child; its result is a function of its
arguments alone (:func:`expected_order_result`), so the invariant checker knows what
every run must have returned. The schedule's workflow is a single inline step.

Each order also has a run of a concurrency-limited workflow (:data:`LIMITED`): at most
:data:`LANE_LIMIT` runs per lane hold a slot at once, and the driver starts them in
bursts of three per lane, so one of each burst queues. Its first and last steps mark,
atomically, when it entered and left (:class:`~.models.SlotMark`).
"""

from __future__ import annotations

import time
from typing import Any

from django_weft import Concurrency, RetryPolicy, activity, activity_info, workflow

from .models import Effect, LedgerRow, SlotMark

ORDER = "chaos.order"
CHILD = "chaos.child"
TICK = "chaos.tick"
LIMITED = "chaos.limited"
LANE_LIMIT = 2
"""How many runs of :data:`LIMITED` hold a slot of one lane at once."""
ENTER = "enter"
LEAVE = "leave"
QUEUE = "chaos"
SIGNAL = "item"
LEDGER_AMOUNT = 7

# Retries that outlast a PostgreSQL restart (a few seconds) without giving up.
PATIENT = RetryPolicy(max_attempts=20, initial_interval=0.5, backoff=1.5, max_interval=5)


@activity(name="chaos.effect", retry=PATIENT)
def effect(key: str, value: int, seconds: float = 0.0) -> int:
    Effect.objects.create(key=key)
    # A turn that holds its run a while, so a paused worker is likely to own some.
    time.sleep(seconds)
    return value


@activity(name="chaos.queued_effect", queue=QUEUE, retry=PATIENT)
def queued_effect(key: str, value: int) -> int:
    Effect.objects.create(key=key)
    return value


@activity(name="chaos.ledger", atomic=True, retry=PATIENT)
def ledger(key: str, amount: int) -> int:
    LedgerRow.objects.create(key=key, run_id=activity_info().run_id, amount=amount)
    return amount


def expected_child_result(key: str) -> str:
    return f"{key}:child"


def expected_order_result(key: str, signals: int) -> dict[str, Any]:
    return {
        "key": key,
        "inline": 1,
        "queued": 2,
        "ledger": LEDGER_AMOUNT,
        "signals": list(range(signals)),
        "child": expected_child_result(key),
    }


@workflow(name=CHILD)
def child(ctx: Any, key: str) -> str:
    ctx.run(effect, f"{key}:child", 0)
    return expected_child_result(key)


@workflow(name=ORDER)
def order(ctx: Any, key: str, signals: int) -> dict[str, Any]:
    inline = ctx.run(effect, f"{key}:inline", 1, 0.3)
    queued = ctx.run(queued_effect, f"{key}:queued", 2)
    amount = ctx.run(ledger, key, LEDGER_AMOUNT)
    ctx.sleep(1)
    # In the order they arrive: the driver sends 0, 1, 2... one after the other.
    received = [ctx.wait_signal(SIGNAL) for _ in range(signals)]
    child_result = ctx.run_child(CHILD, key)
    return {
        "key": key,
        "inline": inline,
        "queued": queued,
        "ledger": amount,
        "signals": received,
        "child": child_result,
    }


@workflow(name=TICK)
def tick(ctx: Any) -> str:
    ctx.run(effect, "tick", 0)
    return TICKED


TICKED = "ticked"


@activity(name="chaos.slot_mark", atomic=True, retry=PATIENT)
def slot_mark(key: str, lane: str, edge: str) -> str:
    SlotMark.objects.create(run_id=activity_info().run_id, key=key, lane=lane, edge=edge)
    return edge


def lane_of(key: str, lane: str) -> str:
    return lane


def lane_for(key: str) -> str:
    """The lane of order ``key``'s limited run: three orders in a row share one, so one of
    every three queues behind the other two."""
    return f"lane-{int(key.rsplit('-', 1)[1]) // 3 % 2}"


def limited_id(key: str) -> str:
    """The workflow id of order ``key``'s limited run."""
    return f"{key}:limited"


def expected_limited_result(key: str, lane: str) -> str:
    return f"{key}:{lane}"


@workflow(name=LIMITED, concurrency=Concurrency(limit=LANE_LIMIT, key=lane_of))
def limited(ctx: Any, key: str, lane: str) -> str:
    """Holds a slot of its lane across a turn that takes a while (so a killed or paused
    worker is likely to own some) and a durable sleep (parked, then woken by a timer),
    marking its entry and its exit."""
    ctx.run(slot_mark, key, lane, ENTER)
    ctx.run(effect, f"{key}:limited", 0, 1.0)
    ctx.sleep(1)
    ctx.run(slot_mark, key, lane, LEAVE)
    return expected_limited_result(key, lane)
