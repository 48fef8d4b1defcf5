"""Workflows with concurrency limits and debounced starts, for the flow-control tests."""

from __future__ import annotations

import time
from typing import Any

from django_weft import Concurrency, Debounce, activity, workflow

from .models import SideEffect


def customer_key(customer: str, *args: Any, **kwargs: Any) -> str:
    return customer


@activity(atomic=True)
def mark(key: str) -> None:
    """Records ``key`` in the run's step transaction: one row per run that got this far."""
    SideEffect.objects.create(key=key)


@activity
def pause(seconds: float) -> None:
    time.sleep(seconds)


@workflow(name="tests.flow.per_key", concurrency=Concurrency(limit=1, key=customer_key))
def per_key(ctx: Any, customer: str, hold: bool = True, again: int = 0) -> str:
    """One run per customer at a time; holds its slot until signalled ``go``."""
    if hold:
        ctx.wait_signal("go")
    if again:
        ctx.continue_as_new(customer, hold=hold, again=again - 1)
    return customer


@workflow(name="tests.flow.one", concurrency=Concurrency(limit=1))
def one(ctx: Any, label: str) -> str:
    """One run of the workflow at a time (no key)."""
    ctx.wait_signal("go")
    return label


@workflow(name="tests.flow.refuse", concurrency=Concurrency(limit=1, key=customer_key, on_limit="cancel_new"))
def refuse(ctx: Any, customer: str) -> str:
    ctx.wait_signal("go")
    return customer


@workflow(name="tests.flow.singleton", concurrency=Concurrency(limit=1, key=customer_key, on_limit="skip"))
def singleton(ctx: Any, customer: str) -> str:
    ctx.wait_signal("go")
    return customer


@workflow(
    name="tests.flow.newest", concurrency=Concurrency(limit=1, key=customer_key, on_limit="cancel_running")
)
def newest(ctx: Any, customer: str) -> str:
    ctx.wait_signal("go")
    return customer


@workflow(name="tests.flow.fair", concurrency=Concurrency(limit=1, key=customer_key, scope="workflow"))
def fair(ctx: Any, customer: str, n: int = 0) -> int:
    """One run of the workflow at a time in all, holding it until signalled ``go``; keys
    take turns."""
    ctx.wait_signal("go")
    ctx.run(mark, f"fair:{customer}:{n}")
    return n


@workflow(name="tests.flow.two_per_key", concurrency=Concurrency(limit=2, key=customer_key))
def two_per_key(ctx: Any, customer: str, n: int, seconds: float = 0.2) -> int:
    """Two runs per customer at a time; marks its start and end, pausing in between."""
    ctx.run(mark, f"begin:{customer}:{n}")
    ctx.run(pause, seconds)
    ctx.run(mark, f"end:{customer}:{n}")
    return n


def order_customer(order: dict[str, Any]) -> Any:
    return order["customer"]


@workflow(name="tests.flow.by_order", concurrency=Concurrency(limit=1, key=order_customer))
def by_order(ctx: Any, order: dict[str, Any]) -> dict[str, Any]:
    return order


# -- for the process tests (tests/integration/test_flow_processes.py) --------------------------


def release_key(name: str) -> str:
    return f"release:{name}"


@activity
def wait_for_release(name: str, timeout: float = 45.0) -> bool:
    """Keeps its worker thread busy until the test writes ``SideEffect(key="release:<name>")``
    (or ``timeout`` passes): the thread and the run's slot stay taken for as long as the
    test needs, without a signal wait (which would free the thread)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if SideEffect.objects.filter(key=release_key(name)).exists():
            return True
        time.sleep(0.05)
    return False


@workflow(name="tests.flow.busy")
def busy(ctx: Any, name: str) -> bool:
    """Holds a worker thread until released (no concurrency limit)."""
    return bool(ctx.run(wait_for_release, name))


@activity(queue="flow")
def queued_step(label: str) -> str:
    return label


@workflow(name="tests.flow.ranked")
def ranked(ctx: Any, label: str, steps: int = 1) -> str:
    """``steps`` queued activities, one after the other, then marks ``done:<label>``: a turn
    sends each activity and parks, and the activity's completion wakes the run for the
    next turn (``steps + 1`` turns in all)."""
    for step in range(steps):
        ctx.run(queued_step, f"{label}:{step}")
    ctx.run(mark, f"done:{label}")
    return label


@workflow(name="tests.flow.fair_queue", concurrency=Concurrency(limit=1, key=customer_key, scope="workflow"))
def fair_queue(ctx: Any, customer: str, n: int = 0, release: str = "") -> int:
    """One run of the workflow at a time in all, keys taking turns, with no signal wait: a
    run marks ``fair_queue:<customer>:<n>`` and completes; with ``release`` it first holds
    the slot (and a thread) until the test releases it."""
    if release:
        ctx.run(wait_for_release, release)
    ctx.run(mark, f"fair_queue:{customer}:{n}")
    return n


# -- debounce -----------------------------------------------------------------------------------


def index_key(index: str, *args: Any, **kwargs: Any) -> str:
    return index


@workflow(name="tests.debounce.reindex", debounce=Debounce(period="30s", max_wait="5m", key=index_key))
def reindex(ctx: Any, index: str, n: int = 0) -> dict[str, Any]:
    """Marks its index and start number once it runs."""
    ctx.run(mark, f"reindex:{index}:{n}")
    return {"index": index, "n": n}


@workflow(name="tests.debounce.quick", debounce=Debounce(period=1, max_wait=5, key=index_key))
def quick(ctx: Any, index: str, n: int = 0) -> int:
    """A short period, for the tests on real time."""
    ctx.run(mark, f"quick:{index}:{n}")
    return n


@workflow(name="tests.debounce.whole", debounce=Debounce(period="1m"))
def whole(ctx: Any, n: int = 0) -> int:
    """One burst for the whole workflow (no key), with no cap on the wait."""
    return n


@workflow(
    name="tests.debounce.limited",
    debounce=Debounce(period="30s", key=index_key),
    concurrency=Concurrency(limit=1),
)
def limited(ctx: Any, index: str, n: int = 0) -> int:
    """Debounced per index, one run of the workflow at a time, holding its slot until
    signalled ``go``."""
    ctx.wait_signal("go")
    return n


def failing_key(index: str, *args: Any, **kwargs: Any) -> Any:
    if index == "raise":
        raise KeyError(index)
    return {"not": "a key"} if index == "dict" else index


@workflow(name="tests.debounce.bad_key", debounce=Debounce(period="30s", key=failing_key))
def bad_key(ctx: Any, index: str) -> str:
    return index
