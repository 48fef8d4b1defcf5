"""Activities with rate limits and concurrency limits, for the activity flow control tests."""

from __future__ import annotations

import os
import time
from typing import Any

from django_weft import Concurrency, RateLimit, RetryPolicy, activity, workflow

from .models import SideEffect

PACED = RateLimit("tests.paced", limit=5, per="1s")
"""Five per second: one every 200 ms (the inline and queued tests share it)."""


def account_key(label: str, account: str = "", **_: Any) -> str:
    return account


@activity(name="tests.af.paced", rate_limit=PACED)
def paced(label: str) -> str:
    SideEffect.objects.create(key=f"paced:{label}")
    return label


@activity(name="tests.af.paced_too", rate_limit=PACED)
def paced_too(label: str) -> str:
    """Another activity naming the same rate limit: it shares the bucket."""
    SideEffect.objects.create(key=f"paced:{label}")
    return label


@activity(name="tests.af.per_account", rate_limit=RateLimit("tests.per_account", 1, "10s", key=account_key))
def per_account(label: str, account: str = "") -> str:
    SideEffect.objects.create(key=f"account:{account}:{label}")
    return label


def order_id(order: dict[str, Any]) -> str:
    return str(order["id"])


@activity(name="tests.af.bad_key", rate_limit=RateLimit("tests.bad_key", 1, "1s", key=order_id))
def bad_key(order: dict[str, Any]) -> None:
    SideEffect.objects.create(key="bad_key:ran")


@activity(
    name="tests.af.flaky_paced",
    rate_limit=RateLimit("tests.flaky_paced", 2, "1s"),
    retry=RetryPolicy(max_attempts=3, initial_interval=0.01, backoff=1.0),
)
def flaky_paced(label: str, fails: int) -> str:
    SideEffect.objects.create(key=f"flaky:{label}")
    if SideEffect.objects.filter(key=f"flaky:{label}").count() <= fails:
        raise RuntimeError(f"failure {label}")
    return label


@activity(name="tests.af.paced_queued", queue="tests", rate_limit=PACED, retry=RetryPolicy(max_attempts=1))
def paced_queued(label: str) -> str:
    SideEffect.objects.create(key=f"paced:{label}")
    return label


@activity(name="tests.af.slotted", concurrency=Concurrency(limit=1, key=account_key))
def slotted(label: str, account: str = "", seconds: float = 0.0, again_seconds: float | None = None) -> str:
    """Sleeps ``seconds``; an execution of the same attempt after the first sleeps
    ``again_seconds`` instead, where given."""
    again = SideEffect.objects.filter(key=f"begin:{label}").exists()
    SideEffect.objects.create(key=f"begin:{label}")
    time.sleep(again_seconds if again and again_seconds is not None else seconds)
    SideEffect.objects.create(key=f"end:{label}")
    return label


@activity(name="tests.af.slotted_queued", queue="tests", concurrency=Concurrency(limit=1))
def slotted_queued(label: str, seconds: float = 0.0) -> str:
    SideEffect.objects.create(key=f"begin:{label}")
    time.sleep(seconds)
    SideEffect.objects.create(key=f"end:{label}")
    return label


@workflow(name="tests.af.one")
def one(ctx: Any, target: str, *args: Any, **kwargs: Any) -> Any:
    """Run the activity named ``target`` once with these arguments and return its result."""
    acts = {
        "paced": paced, "paced_too": paced_too, "per_account": per_account, "bad_key": bad_key,
        "flaky_paced": flaky_paced, "paced_queued": paced_queued, "slotted": slotted,
        "slotted_queued": slotted_queued,
    }  # fmt: skip
    return ctx.run(acts[target], *args, **kwargs)


@workflow(name="tests.af.two_paced")
def two_paced(ctx: Any, label: str) -> list[str]:
    """Two rate-limited inline activities in a row."""
    return [ctx.run(paced, f"{label}-1"), ctx.run(paced, f"{label}-2")]


@workflow(name="tests.af.fan_out")
def fan_out(ctx: Any, label: str, n: int) -> list[str]:
    """``n`` queued rate-limited activities started at once, waited for together."""
    return ctx.wait_all([ctx.start(paced_queued, f"{label}-{i}") for i in range(n)])


# -- the process tests ---------------------------------------------------------------------


@activity(name="tests.af.twenty", rate_limit=RateLimit("tests.twenty", limit=20, per="1s"))
def twenty(label: str) -> None:
    """Records its label and the process that ran it."""
    SideEffect.objects.create(key=f"twenty:{label}:{os.getpid()}")


@workflow(name="tests.af.twenty_per_second")
def twenty_per_second(ctx: Any, label: str) -> None:
    ctx.run(twenty, label)


@activity(name="tests.af.two_at_once", concurrency=Concurrency(limit=2))
def two_at_once(label: str, seconds: float) -> None:
    SideEffect.objects.create(key=f"begin:{label}")
    time.sleep(seconds)
    SideEffect.objects.create(key=f"end:{label}")


@workflow(name="tests.af.at_most_two")
def at_most_two(ctx: Any, label: str, seconds: float = 0.2) -> None:
    ctx.run(two_at_once, label, seconds)
