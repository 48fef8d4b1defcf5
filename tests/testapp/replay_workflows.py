"""Workflows whose code the replay tests change under stored runs.

The code variant is read at import from ``WEFT_TEST_REPLAY_VARIANT`` (a ``weft_replay``
process gets it in its environment) and at each call from :data:`VARIANT` (an
in-process test sets it with ``monkeypatch``); ``WEFT_TEST_REPLAY_RETIRED=1`` leaves
``tests.replay.retired`` unregistered, as if a deploy had removed it.

Variants: ``original``; ``reordered`` (the order workflow charges before it reserves);
``patched`` (the same change behind ``ctx.patched``); ``handler_changed`` (the
``address`` update handler runs another activity); ``unpatched`` (the child workflow's
``ctx.patched`` call removed, its new path kept).
"""

from __future__ import annotations

import os
from typing import Any

from django_weft import CancellationRequested, RetryPolicy, activity, workflow

from .models import SideEffect

VARIANT = os.environ.get("WEFT_TEST_REPLAY_VARIANT", "original")
RETIRED = os.environ.get("WEFT_TEST_REPLAY_RETIRED") == "1"
NO_RETRY = RetryPolicy(max_attempts=1)


def _executed(key: str) -> None:
    SideEffect.objects.create(key=key)


@activity(name="tests.replay.reserve", retry=NO_RETRY)
def reserve(key: str) -> str:
    _executed(f"{key}:reserve")
    return f"reserved {key}"


@activity(name="tests.replay.charge", retry=NO_RETRY)
def charge(key: str) -> str:
    _executed(f"{key}:charge")
    return f"receipt {key}"


@activity(name="tests.replay.ship", retry=NO_RETRY)
def ship(key: str) -> str:
    _executed(f"{key}:ship")
    return f"shipped {key}"


def _charges_first(ctx: Any) -> bool:
    if VARIANT == "reordered":
        return True
    if VARIANT == "patched":
        return bool(ctx.patched("charge-first"))
    return False


@workflow(name="tests.replay.order")
def order(ctx: Any, key: str, wait: bool = True) -> str:
    """Reserve, charge (the order a deploy changes), wait for "ship", ship."""
    if _charges_first(ctx):
        receipt = ctx.run(charge, key)
        ctx.run(reserve, key)
    else:
        ctx.run(reserve, key)
        receipt = ctx.run(charge, key)
    if wait:
        ctx.wait_signal("ship")
    ctx.run(ship, key)
    return str(receipt)


@activity(name="tests.replay.normalise", retry=NO_RETRY)
def normalise(address: dict[str, Any]) -> dict[str, Any]:
    _executed("normalise")
    return {key: str(value).strip().title() for key, value in address.items()}


@activity(name="tests.replay.geocode", retry=NO_RETRY)
def geocode(address: dict[str, Any]) -> dict[str, Any]:
    _executed("geocode")
    return {**address, "lat": 0.0}


@workflow(name="tests.replay.handlers")
def handlers(ctx: Any, key: str) -> dict[str, Any]:
    """Signal and update handlers (one with an activity inside), a query, recorded values,
    search attributes and a condition the handlers satisfy; then a long sleep."""
    state: dict[str, Any] = {"items": [], "address": None, "closed": False}
    ctx.on_query("state", lambda: state)
    ctx.on_signal("item", state["items"].append)

    def change_address(new: dict[str, Any]) -> dict[str, Any]:
        state["address"] = ctx.run(geocode if VARIANT == "handler_changed" else normalise, new)
        return dict(state["address"])

    def close(_payload: Any) -> bool:
        state["closed"] = True
        return True

    ctx.on_update("address", change_address)
    ctx.on_update("close", close)
    state["opened_at"] = ctx.now().isoformat()
    state["token"] = str(ctx.uuid4())
    state["lucky"] = ctx.side_effect(lambda: 7, name="lucky")
    ctx.set_search_attributes({"stage": "open", "key": key})
    ctx.wait_condition(lambda: state["closed"])
    ctx.set_search_attributes({"stage": "closed"})
    ctx.sleep("1h")
    return state


@activity(name="tests.replay.release", retry=NO_RETRY)
def release(key: str) -> None:
    _executed(f"{key}:release")


@workflow(name="tests.replay.child")
def child(ctx: Any, key: str) -> str:
    return str(ctx.run(reserve, f"{key}:child"))


@workflow(name="tests.replay.parent")
def parent(ctx: Any, key: str) -> str:
    """A patched marker, a child, then a sleep that a cancellation request interrupts."""
    if VARIANT == "unpatched" or ctx.patched("child-first"):
        ctx.run_child(child, key)
    try:
        ctx.sleep("1h")
    except CancellationRequested:
        ctx.run(release, key)
        raise
    return "slept"


def retired(ctx: Any, key: str) -> str:
    """Registered as ``tests.replay.retired`` unless ``WEFT_TEST_REPLAY_RETIRED=1``."""
    ctx.run(reserve, key)
    ctx.wait_signal("go")
    return "done"


if not RETIRED:
    workflow(name="tests.replay.retired")(retired)
