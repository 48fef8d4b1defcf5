"""The chaos workload (autodiscovered like a user's workflows module).

An order runs an inline activity, a queued activity, an atomic ledger step, a durable
sleep, waits for its numbered signals and runs a child; its result is a function of its
arguments alone (:func:`expected_order_result`), so the invariant checker knows what
every run must have returned. The schedule's workflow is a single inline step.
"""

from __future__ import annotations

import time
from typing import Any

from django_weft import RetryPolicy, activity, activity_info, workflow

from .models import Effect, LedgerRow

ORDER = "chaos.order"
CHILD = "chaos.child"
TICK = "chaos.tick"
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
