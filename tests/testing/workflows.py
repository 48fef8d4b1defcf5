"""Workflows for the ``weft`` fixture's tests (registered when a test module imports them)."""

from __future__ import annotations

from typing import Any

from django_weft import (
    RetryPolicy,
    SignalTimeout,
    activity,
    activity_info,
    workflow,
)
from tests.testapp.models import SideEffect

NO_RETRY = RetryPolicy(max_attempts=1)


@activity(name="tests.testing.note", retry=NO_RETRY)
def note(key: str) -> str:
    """Writes one SideEffect row per execution."""
    SideEffect.objects.create(key=key)
    return key


@activity(
    name="tests.testing.quote",
    retry=RetryPolicy(max_attempts=3, initial_interval="1h", backoff=2, max_interval="2h"),
)
def quote(item: str) -> int:
    """Asks a (pretend) supplier for a price; retried an hour later, then two."""
    SideEffect.objects.create(key=f"quote:{item}:{activity_info().attempt}")
    return 100


@activity(name="tests.testing.quick_retry", retry=RetryPolicy(max_attempts=4, initial_interval=1, backoff=1))
def quick_retry(key: str) -> str:
    return key


@activity(name="tests.testing.mail", queue="emails")
def mail(to: str) -> str:
    return f"sent to {to}"


@workflow(name="tests.testing.sleeper")
def sleeper(ctx: Any, span: str) -> dict[str, str]:
    before = ctx.now()
    ctx.sleep(span)
    return {"before": before.isoformat(), "after": ctx.now().isoformat()}


@workflow(name="tests.testing.two_sleeps")
def two_sleeps(ctx: Any) -> list[str]:
    woke = []
    for _ in range(2):
        ctx.sleep("1d")
        woke.append(ctx.now().isoformat())
        ctx.run(note, f"two_sleeps:{len(woke)}")
    return woke


@workflow(name="tests.testing.approval")
def approval(ctx: Any, order: int) -> dict[str, Any]:
    state = {"order": order, "notes": []}
    ctx.on_query("state", lambda: state)

    def add_note(text: str) -> int:
        state["notes"].append(text)
        return len(state["notes"])

    ctx.on_update("add_note", add_note)
    try:
        decision = ctx.wait_signal("decision", timeout="7d")
    except SignalTimeout:
        decision = {"by": None, "approved": False}
    return {**state, "decision": decision, "decided_at": ctx.now().isoformat()}


@workflow(name="tests.testing.priced")
def priced(ctx: Any, item: str) -> int:
    return int(ctx.run(quote, item))


@workflow(name="tests.testing.quick")
def quick(ctx: Any, key: str) -> dict[str, Any]:
    before = ctx.now()
    value = ctx.run(quick_retry, key)
    return {"value": value, "waited": (ctx.now() - before).total_seconds()}


@workflow(name="tests.testing.mailer")
def mailer(ctx: Any, to: str) -> str:
    return str(ctx.run(mail, to))


@workflow(name="tests.testing.now")
def now(ctx: Any) -> str:
    return ctx.now().isoformat()
