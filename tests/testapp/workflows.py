"""Workflows and activities used by the test suite (autodiscovered like a user's)."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, date, datetime
from typing import Any

from django.db import connection

from django_weft import (
    CancellationRequested,
    ChildWorkflowFailed,
    RetryPolicy,
    SignalTimeout,
    WorkflowAlreadyExists,
    WorkflowCancelled,
    activity,
    activity_info,
    schedule,
    workflow,
)
from django_weft.models import WorkflowRun

from .models import LedgerEntry, SideEffect

NO_RETRY = RetryPolicy(max_attempts=1)

# Per-test knobs for in-process tests; keyed by whatever the test chooses.
counters: dict[str, int] = {}
counters_lock = threading.Lock()


def bump(key: str) -> int:
    with counters_lock:
        counters[key] = counters.get(key, 0) + 1
        return counters[key]


@activity(name="tests.record", retry=NO_RETRY)
def record(key: str, value: Any = None) -> Any:
    """Writes one SideEffect row per execution, so tests can count executions."""
    SideEffect.objects.create(key=key)
    return value


@activity(name="tests.noop", retry=NO_RETRY)
def noop(value: Any = None) -> Any:
    return value


@workflow(name="tests.ten_steps")
def ten_steps(ctx: Any, key: str) -> dict[str, Any]:
    total = 0
    for i in range(10):
        total += ctx.run(record, f"{key}:{i}", i)
    return {"total": total}


@workflow(name="tests.steps_with_sleep")
def steps_with_sleep(ctx: Any, key: str, steps: int = 6, sleep: float = 1.0) -> int:
    for i in range(steps // 2):
        ctx.run(record, f"{key}:{i}", i)
    ctx.sleep(sleep)
    for i in range(steps // 2, steps):
        ctx.run(record, f"{key}:{i}", i)
    return steps


@activity(name="tests.slow_record", retry=NO_RETRY)
def slow_record(key: str, seconds: float) -> str:
    SideEffect.objects.create(key=key)
    time.sleep(seconds)
    return key


@workflow(name="tests.slow_middle")
def slow_middle(ctx: Any, key: str, seconds: float = 1.0) -> str:
    ctx.run(record, f"{key}:before")
    ctx.run(slow_record, f"{key}:slow", seconds)
    ctx.run(record, f"{key}:after")
    return "done"


@activity(name="tests.ledger_write", atomic=True, retry=NO_RETRY)
def ledger_write(key: str, amount: int) -> int:
    LedgerEntry.objects.create(key=key, amount=amount)
    SideEffect.objects.create(key=f"{key}:ledger")
    return amount


@workflow(name="tests.atomic_ledger")
def atomic_ledger(ctx: Any, key: str) -> int:
    ctx.run(record, f"{key}:before")
    amount = ctx.run(ledger_write, key, 42)
    ctx.run(record, f"{key}:after")
    return int(amount)


@activity(name="tests.flaky", retry=RetryPolicy(max_attempts=5, initial_interval=0.01, backoff=1.0))
def flaky(key: str, failures: int) -> int:
    attempt = activity_info().attempt
    SideEffect.objects.create(key=f"{key}:attempt{attempt}")
    if attempt <= failures:
        raise ConnectionError(f"attempt {attempt} failed")
    return attempt


@workflow(name="tests.flaky")
def flaky_workflow(ctx: Any, key: str, failures: int) -> int:
    return int(ctx.run(flaky, key, failures))


class PaymentDeclined(Exception):
    pass


@activity(
    name="tests.declined",
    retry=RetryPolicy(max_attempts=5, initial_interval=0.01, non_retryable=(PaymentDeclined,)),
)
def declined(key: str) -> None:
    SideEffect.objects.create(key=key)
    raise PaymentDeclined("card declined")


@workflow(name="tests.declined")
def declined_workflow(ctx: Any, key: str) -> None:
    ctx.run(declined, key)


@activity(name="tests.always_fails", retry=RetryPolicy(max_attempts=3, initial_interval=0.01))
def always_fails(key: str) -> None:
    attempt = activity_info().attempt
    SideEffect.objects.create(key=key)
    raise ValueError(f"boom on attempt {attempt}")


@workflow(name="tests.always_fails")
def always_fails_workflow(ctx: Any, key: str) -> None:
    ctx.run(always_fails, key)


def fails_its_first_attempt(key: str) -> int:
    """Records each attempt (``<key>:attempt<n>``); the first fails."""
    attempt = activity_info().attempt
    SideEffect.objects.create(key=f"{key}:attempt{attempt}")
    if attempt == 1:
        raise ConnectionError("first attempt fails")
    return attempt


@activity(name="tests.durable_retry", retry=RetryPolicy(max_attempts=3, initial_interval=0.5, backoff=1.0))
def durable_retry(key: str) -> int:
    return fails_its_first_attempt(key)


@workflow(name="tests.durable_retry")
def durable_retry_workflow(ctx: Any, key: str) -> int:
    return int(ctx.run(durable_retry, key))


# Order of steps switched by an environment variable / module flag, for the
# non-determinism tests (simulates a deploy that changed the code).
ORDER = {"swap": False, "patched": False}


@activity(name="tests.a", retry=NO_RETRY)
def step_a() -> str:
    return "a"


@activity(name="tests.b", retry=NO_RETRY)
def step_b() -> str:
    return "b"


@workflow(name="tests.reorder")
def reorder(ctx: Any) -> list[str]:
    if ORDER["patched"]:
        if ctx.patched("b-before-a"):
            out = [ctx.run(step_b), ctx.run(step_a)]
        else:
            out = [ctx.run(step_a), ctx.run(step_b)]
    elif ORDER["swap"]:
        out = [ctx.run(step_b), ctx.run(step_a)]
    else:
        out = [ctx.run(step_a), ctx.run(step_b)]
    ctx.sleep(0.2)
    out.append(ctx.run(noop, "c"))
    return out


@workflow(name="tests.sleepy")
def sleepy(ctx: Any, seconds: float = 2.0) -> str:
    ctx.run(record, "sleepy:before")
    ctx.sleep(seconds)
    woke = ctx.now()
    ctx.run(record, "sleepy:after")
    return woke.isoformat()


@workflow(name="tests.echo")
def echo(ctx: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@workflow(name="tests.recorded_values")
def recorded_values(ctx: Any) -> dict[str, Any]:
    ctx.logger.info("computing values")
    values = {
        "uuid": str(ctx.uuid4()),
        "random": ctx.random(),
        "now": ctx.now().isoformat(),
        "pid": ctx.side_effect(os.getpid),
    }
    ctx.sleep(0.05)
    ctx.logger.info("after the sleep")
    return values


@workflow(name="tests.countdown")
def countdown(ctx: Any, n: int) -> str:
    ctx.run(noop, n)
    if n > 0:
        ctx.continue_as_new(n - 1)
    return "liftoff"


@workflow(name="tests.raises")
def raises(ctx: Any) -> None:
    ctx.run(noop, 1)
    raise KeyError("missing thing")


@workflow(name="tests.inline_steps")
def inline_steps(ctx: Any, steps: int) -> int:
    for i in range(steps):
        ctx.run(noop, i)
    return steps


@activity(name="tests.whoami", retry=NO_RETRY)
def whoami(key: str) -> str:
    """Returns the name of the thread that ran it (tells which engine executed it)."""
    SideEffect.objects.create(key=key)
    return threading.current_thread().name


@workflow(name="tests.fence_probe")
def fence_probe(ctx: Any, key: str) -> list[str]:
    return [ctx.run(whoami, f"{key}:{i}") for i in range(3)]


@activity(name="tests.compensate", retry=NO_RETRY)
def compensate(key: str) -> None:
    SideEffect.objects.create(key=key)


@workflow(name="tests.saga")
def saga(ctx: Any, key: str) -> str:
    try:
        ctx.run(whoami, f"{key}:charge")
    except Exception:
        ctx.run(compensate, f"{key}:refund")
        return "compensated"
    return "charged"


@workflow(name="tests.converts_unwinding")
def converts_unwinding(ctx: Any) -> None:
    try:
        ctx.sleep(60)
    except BaseException as exc:
        raise RuntimeError("cleanup failed") from exc


SHAPE = {"drop_tail": False}


@workflow(name="tests.trailing")
def trailing(ctx: Any) -> str:
    ctx.run(step_a)
    if not SHAPE["drop_tail"]:
        ctx.sleep(0.1)
        ctx.run(step_b)
    return "done"


# -- queued activities and fan-out -------------------------------------------------------


@activity(name="tests.q.record", queue="tests", retry=NO_RETRY)
def queued_record(key: str, value: Any = None) -> Any:
    SideEffect.objects.create(key=key)
    return value


@activity(name="tests.q.sleep", queue="tests", retry=NO_RETRY, timeout=30)
def queued_sleep(key: str, seconds: float) -> str:
    SideEffect.objects.create(key=key)
    time.sleep(seconds)
    return key


@activity(
    name="tests.q.flaky",
    queue="tests",
    retry=RetryPolicy(max_attempts=3, initial_interval=0.05, backoff=1.0),
)
def queued_flaky(key: str, failures: int) -> int:
    """Fails ``failures`` times (counted in the database), then succeeds."""
    SideEffect.objects.create(key=key)
    done = SideEffect.objects.filter(key=key).count()
    if done <= failures:
        raise RuntimeError(f"flaky failure {done} of {failures}")
    return done


@activity(name="tests.q.broken", queue="tests", retry=RetryPolicy(max_attempts=3, non_retryable=(KeyError,)))
def queued_broken(key: str) -> None:
    SideEffect.objects.create(key=key)
    raise KeyError(key)


@activity(
    name="tests.q.ledger",
    queue="tests",
    atomic=True,
    retry=RetryPolicy(max_attempts=2, initial_interval=0.01),
)
def queued_ledger(key: str, amount: int, fail_first: bool = False) -> int:
    LedgerEntry.objects.create(key=key, amount=amount)
    if fail_first and activity_info().attempt == 1:
        raise RuntimeError("rolled back with the attempt")
    return amount


@workflow(name="tests.q.single")
def queued_single(ctx: Any, key: str) -> Any:
    before = ctx.run(record, f"{key}:inline-before", 1)
    value = ctx.run(queued_record, f"{key}:queued", 2)
    after = ctx.run(record, f"{key}:inline-after", 3)
    return [before, value, after]


@workflow(name="tests.q.fan_out")
def queued_fan_out(ctx: Any, key: str, n: int, seconds: float = 0.0) -> list[str]:
    handles = [ctx.start(queued_sleep, f"{key}:{i}", seconds) for i in range(n)]
    return list(ctx.wait_all(handles))


@workflow(name="tests.q.mixed")
def queued_mixed(ctx: Any, key: str) -> dict[str, Any]:
    inline = ctx.start(record, f"{key}:inline", "inline")
    queued = ctx.start(queued_record, f"{key}:queued", "queued")
    first = ctx.wait_any([queued, inline])
    both = ctx.wait_all([inline, queued])
    return {"first": first.activity.name, "both": both}


@workflow(name="tests.q.race")
def queued_race(ctx: Any, key: str) -> str:
    slow = ctx.start(queued_sleep, f"{key}:slow", 5)
    fast = ctx.start(queued_sleep, f"{key}:fast", 0)
    winner = ctx.wait_any([slow, fast])
    return str(winner.result())


@workflow(name="tests.q.flaky")
def queued_flaky_wf(ctx: Any, key: str, failures: int) -> int:
    return int(ctx.run(queued_flaky, key, failures))


@workflow(name="tests.q.broken")
def queued_broken_wf(ctx: Any, key: str) -> str:
    try:
        ctx.run(queued_broken, key)
    except Exception as exc:
        return f"caught {type(exc).__name__}"
    return "not raised"


@workflow(name="tests.q.ledger")
def queued_ledger_wf(ctx: Any, key: str, fail_first: bool = False) -> int:
    return int(ctx.run(queued_ledger, key, 5, fail_first))


@workflow(name="tests.slow_steps_with_sleep")
def slow_steps_with_sleep(
    ctx: Any, key: str, steps: int = 10, step_seconds: float = 0.1, sleep: float = 1.0
) -> int:
    """The process tests' workload: slowish inline steps, a durable sleep in the middle."""
    for i in range(steps):
        if i == steps // 2:
            ctx.sleep(sleep)
        ctx.run(slow_record, f"{key}:{i}", step_seconds)
    return steps


@workflow(name="tests.sleeps")
def sleeps(ctx: Any, n: int = 3, seconds: float = 0.3) -> int:
    for _ in range(n):
        ctx.sleep(seconds)
    return n


@activity(name="tests.q.sleep_retry", queue="tests", retry=RetryPolicy(max_attempts=3, initial_interval=0.1))
def queued_sleep_retry(key: str, seconds: float) -> int:
    SideEffect.objects.create(key=key)
    time.sleep(seconds)
    return activity_info().attempt


@workflow(name="tests.q.long_activity")
def queued_long_activity(ctx: Any, key: str, seconds: float) -> int:
    return int(ctx.run(queued_sleep_retry, key, seconds))


@activity(name="tests.q.overrun", queue="tests", retry=NO_RETRY, timeout=1)
def queued_overrun(key: str) -> str:
    SideEffect.objects.create(key=key)
    time.sleep(8)
    return "finished"


@workflow(name="tests.q.overrun")
def queued_overrun_wf(ctx: Any, key: str) -> str:
    try:
        return str(ctx.run(queued_overrun, key))
    except Exception as exc:
        return f"caught {exc}"


@workflow(name="tests.q.background")
def queued_background(ctx: Any, key: str) -> int:
    """Starts a queued activity, then sleeps long before waiting for it."""
    handle = ctx.start(queued_flaky, key, 1)
    ctx.sleep(30)
    return int(handle.result())


# -- signals, updates and queries --------------------------------------------------------


@workflow(name="tests.m.collect")
def collect_signals(ctx: Any, name: str, count: int) -> list[Any]:
    """Consumes ``count`` signals ``name`` in a loop; answers query "received"."""
    received: list[Any] = []
    ctx.on_query("received", lambda: list(received))
    for _ in range(count):
        received.append(ctx.wait_signal(name))
    return received


@workflow(name="tests.m.wait_with_timeout")
def wait_with_timeout(ctx: Any, timeout: float) -> str:
    try:
        payload = ctx.wait_signal("go", timeout=timeout)
    except SignalTimeout:
        return "timed out"
    return f"got {payload}"


@activity(name="tests.m.bomb", retry=NO_RETRY)
def bomb(key: str) -> None:
    """Fails any test that calls it: queries must never run activities."""
    SideEffect.objects.create(key=f"bomb:{key}")
    raise AssertionError("an activity ran during a query")


@activity(name="tests.m.audit", retry=NO_RETRY, atomic=True)
def audit(key: str, value: Any = None) -> Any:
    """Counts executions (one SideEffect row each, committed with the step)."""
    SideEffect.objects.create(key=key)
    return value


def _city_validator(payload: Any) -> None:
    if not isinstance(payload, dict) or not payload.get("city"):
        raise ValueError("city is required")


@workflow(name="tests.m.cart")
def cart(ctx: Any, key: str) -> dict[str, Any]:
    """Items arrive by signal handler, the address by update; checks out on "checkout"."""
    state: dict[str, Any] = {"items": [], "address": None, "closed": False}
    ctx.on_query("state", lambda: state)
    ctx.on_query("count", lambda plus=0: len(state["items"]) + plus)
    ctx.on_signal("add", lambda item: state["items"].append(item))

    def change_address(new: dict[str, Any]) -> dict[str, Any]:
        ctx.run(audit, f"{key}:address", new)
        state["address"] = new
        return {"address": new, "items": len(state["items"])}

    def close(_payload: Any) -> str:
        state["closed"] = True
        return "closed"

    ctx.on_update("address", change_address, validator=_city_validator)
    ctx.on_update("close", close)
    ctx.on_update("nap", lambda _payload: ctx.sleep(1))
    ctx.on_update("broken", lambda _payload: 1 / 0)
    ctx.wait_condition(lambda: state["closed"])
    return state


@workflow(name="tests.m.query_guard")
def query_guard(ctx: Any, key: str) -> str:
    """Waits for a signal, then runs an activity that must never run during a query."""
    stage = {"value": "started"}
    ctx.on_query("stage", lambda: stage["value"])
    ctx.run(record, f"{key}:before")
    stage["value"] = "waiting"
    ctx.wait_signal("go")
    stage["value"] = "running bomb"
    ctx.run(bomb, key)
    return "unreachable"


@workflow(name="tests.m.condition")
def condition(ctx: Any, needed: int, timeout: float | None = None) -> dict[str, Any]:
    seen: list[Any] = []
    ctx.on_signal("item", seen.append)
    ok = ctx.wait_condition(lambda: len(seen) >= needed, timeout=timeout)
    return {"ok": ok, "seen": list(seen)}


@workflow(name="tests.m.sleep_with_handlers")
def sleep_with_handlers(ctx: Any, seconds: float) -> dict[str, Any]:
    notes: list[Any] = []
    ctx.on_signal("note", notes.append)
    ctx.on_update("notes", lambda _payload: list(notes))
    ctx.sleep(seconds)
    return {"notes": notes}


@activity(name="tests.m.q_echo", queue="tests", retry=NO_RETRY)
def queued_echo(value: Any) -> Any:
    return value


@workflow(name="tests.m.two_waits")
def two_waits(ctx: Any, key: str) -> dict[str, Any]:
    """Two result() waits in a row: a handler applied while blocked at the second must be
    re-applied there on replay, not at the first."""
    state = {"approved": False}
    ctx.on_signal("approve", lambda _payload: state.__setitem__("approved", True))
    first = ctx.start(queued_echo, 1)
    second = ctx.start(queued_echo, 2)
    first.result()
    seen = state["approved"]
    if seen:
        ctx.run(record, f"{key}:seen")
    second.result()
    return {"seen_after_first": seen, "approved": state["approved"]}


@workflow(name="tests.m.any_with_handler")
def any_with_handler(ctx: Any) -> dict[str, Any]:
    notes: list[Any] = []
    ctx.on_signal("note", notes.append)
    handle = ctx.start(queued_echo, "done")
    ctx.wait_any([handle])
    return {"notes": notes, "result": handle.result()}


update_handler_activity = {"name": "tests.record"}


@workflow(name="tests.m.changing_update")
def changing_update(ctx: Any, key: str) -> int:
    state = {"n": 0}

    def bump(_payload: Any) -> int:
        ctx.run(record if update_handler_activity["name"] == "tests.record" else noop, f"{key}:bump")
        state["n"] += 1
        return state["n"]

    ctx.on_update("bump", bump)
    ctx.sleep(3600)
    return state["n"]


@activity(name="tests.m.retry_later", retry=RetryPolicy(max_attempts=3, initial_interval=60))
def retry_later(key: str) -> int:
    """Fails its first attempt; the next one comes a minute later (a durable retry)."""
    return fails_its_first_attempt(key)


@workflow(name="tests.m.retrying_update")
def retrying_update(ctx: Any, key: str) -> str:
    """An update handler whose activity waits for a durable retry (its first attempt fails);
    the body cleans up when it receives a cancellation request."""
    ctx.on_update("charge", lambda _payload: ctx.run(retry_later, key))
    try:
        ctx.wait_signal("go")
    except CancellationRequested:
        ctx.run(record, f"{key}:cleanup")
        raise
    return "done"


@workflow(name="tests.m.query_uses_ctx")
def query_uses_ctx(ctx: Any) -> None:
    ctx.on_query("now", lambda: str(ctx.now()))
    ctx.wait_signal("go")


# -- lifecycle -------------------------------------------------------------------------

bugs = {"step_4": True, "v2": False}


@activity(name="tests.l.buggy_step", retry=NO_RETRY)
def buggy_step(key: str, i: int) -> int:
    SideEffect.objects.create(key=f"{key}:{i}")
    if i == 4 and bugs["step_4"]:
        raise RuntimeError("a bug in step 4")
    return i


@workflow(name="tests.l.eight_steps")
def eight_steps(ctx: Any, key: str) -> int:
    return sum(ctx.run(buggy_step, key, i) for i in range(8))


@workflow(name="tests.l.changing")
def changing(ctx: Any, key: str) -> str:
    ctx.run(noop if bugs["v2"] else record, f"{key}:first")
    ctx.sleep(0.05)
    ctx.run(record, f"{key}:second")
    return "done"


@activity(name="tests.l.dawdle", retry=NO_RETRY)
def dawdle(i: int, seconds: float) -> int:
    time.sleep(seconds)
    return i


@workflow(name="tests.l.churn")
def churn(ctx: Any, key: str, steps: int = 4, pause: float = 0.02) -> int:
    """Several turns, each a few milliseconds long: a slow step, a short durable sleep..."""
    for i in range(steps):
        ctx.run(dawdle, i, 0.005)
        ctx.sleep(pause)
    return steps


# -- child workflows -------------------------------------------------------------------


@workflow(name="tests.c.child")
def child(ctx: Any, key: str, seconds: float = 0.0, fail: bool = False) -> str:
    ctx.run(record, f"{key}:child")
    if seconds:
        ctx.sleep(seconds)
    if fail:
        raise ValueError(f"child {key} failed")
    return f"child {key} done"


@workflow(name="tests.c.parent")
def parent(ctx: Any, key: str, seconds: float = 1.0, policy: str = "terminate") -> dict[str, Any]:
    ctx.run(record, f"{key}:parent-before")
    value = ctx.run_child(child, key, seconds, parent_close_policy=policy)
    ctx.run(record, f"{key}:parent-after")
    return {"child": value}


@workflow(name="tests.c.catches")
def catches(ctx: Any, key: str) -> dict[str, Any]:
    try:
        ctx.run_child("tests.c.child", key, fail=True)
    except ChildWorkflowFailed as exc:
        return {"caught": exc.status, "type": exc.error_type, "message": exc.error_message}
    return {"caught": None}


@workflow(name="tests.c.fan_out")
def fan_out_children(ctx: Any, key: str, n: int) -> list[str]:
    handles = [ctx.start_child(child, f"{key}-{i}", 0.2) for i in range(n)]
    return list(ctx.wait_all(handles))


@workflow(name="tests.c.same_id")
def same_id(ctx: Any, key: str) -> str:
    ctx.start_child(child, key, 60, id=f"{key}-fixed")
    try:
        ctx.start_child(child, key, 60, id=f"{key}-fixed")
    except WorkflowAlreadyExists:
        return "refused"
    return "started twice"


# -- finalizers ------------------------------------------------------------------------

finalizer_failures: dict[str, int] = {}


@activity(name="tests.f.cleanup", retry=RetryPolicy(max_attempts=3, initial_interval=0.01, backoff=1.0))
def cleanup(state: dict[str, Any]) -> str:
    key = state["key"]
    SideEffect.objects.create(key=f"{key}:cleanup")
    if SideEffect.objects.filter(key=f"{key}:cleanup").count() <= finalizer_failures.get(key, 0):
        raise RuntimeError(f"cleanup of {key} failed")
    return f"cleaned {state['stage']}"


@workflow(name="tests.f.booking", finalizer=cleanup)
def booking(ctx: Any, key: str) -> str:
    ctx.set_finalizer_state({"key": key, "stage": "started"})
    ctx.run(record, f"{key}:book")
    ctx.set_finalizer_state({"key": key, "stage": "booked"})
    ctx.wait_signal("confirm")
    return "confirmed"


@workflow(name="tests.c.parent_continues")
def parent_continues(ctx: Any, key: str, round: int = 0) -> str:
    if round == 0:
        ctx.start_child(child, key, 60)
        ctx.continue_as_new(key, 1)
    return "second round"


@workflow(name="tests.c.retry_child")
def retry_child(ctx: Any, key: str) -> str:
    return str(ctx.run_child(child, key, fail=bugs["step_4"]))


@workflow(name="tests.c.bad_id")
def bad_child_id(ctx: Any) -> None:
    ctx.start_child(child, "x", id="")


@workflow(name="tests.c.countdown_parent_for_skew")
def countdown_parent_for_skew(ctx: Any) -> Any:
    return ctx.run_child("tests.countdown", 1)


@workflow(name="tests.schedule_info")
def schedule_info(ctx: Any) -> dict[str, Any]:
    """Returns the schedule id and scheduled time of its run (``None`` when not scheduled)."""
    moment = ctx.info.scheduled_at
    return {"schedule_id": ctx.info.schedule_id, "scheduled_at": moment.isoformat() if moment else None}


@workflow(
    name="tests.scheduled_report",
    schedules=[schedule("tests-nightly-report", cron="0 2 * * *", timezone="Europe/Oslo", args=["nightly"])],
)
def scheduled_report(ctx: Any, kind: str = "daily") -> str:
    """Declares a schedule in code (synced by ``manage.py weft_schedules sync``)."""
    return f"{kind} report"


# -- search attributes set from workflow code --------------------------------------------------


@workflow(name="tests.attrs.lifecycle")
def attrs_lifecycle(ctx: Any, key: str) -> Any:
    """Sets typed attributes, removes one, waits for signal ``finish``, then says it is done."""
    ctx.set_search_attributes(
        {
            "customer": 7,
            "tier": "gold",
            "score": 2.5,
            "vip": True,
            "due": datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
            "day": date(2030, 1, 2),
            "temp": key,
        }
    )
    ctx.run(record, f"{key}:between")
    ctx.set_search_attributes({"temp": None, "stage": "waiting"})
    payload = ctx.wait_signal("finish")
    ctx.set_search_attributes({"stage": "done"})
    return payload


@workflow(name="tests.attrs.set")
def attrs_set(ctx: Any, attributes: Any) -> str:
    """Sets ``attributes`` (as given at start) and returns."""
    ctx.set_search_attributes(attributes)
    return "set"


@workflow(name="tests.attrs.steps")
def attrs_steps(ctx: Any, key: str) -> str:
    """Attributes around an activity: step 0 sets them, step 2 moves ``stage`` on."""
    ctx.set_search_attributes({"order": key, "stage": "charging"})
    ctx.run(record, f"{key}:charge")
    ctx.set_search_attributes({"stage": "charged"})
    return "charged"


@activity(name="tests.attrs.searched_elsewhere", retry=NO_RETRY)
def searched_elsewhere(key: str) -> bool:
    """Whether another database connection (another thread) finds the run by ``order=key``."""
    found: list[bool] = []

    def look() -> None:
        try:
            found.append(WorkflowRun.objects.search(order=key).exists())
        finally:
            connection.close()

    thread = threading.Thread(target=look)
    thread.start()
    thread.join(30)
    return found[0]


@workflow(name="tests.attrs.seen")
def attrs_seen(ctx: Any, key: str) -> bool:
    """Sets ``order``, then asks from another connection, within the same turn, whether
    the run is found by it."""
    ctx.set_search_attributes({"order": key})
    return bool(ctx.run(searched_elsewhere, key))


@workflow(name="tests.attrs.chain")
def attrs_chain(ctx: Any, n: int) -> int:
    """The first run sets an attribute and continues as new; the successor returns."""
    if n == 0:
        ctx.set_search_attributes({"customer": 7})
        ctx.continue_as_new(1)
    return n


# -- cancellation requests (handle.cancel(mode="request")) -----------------------------


@workflow(name="tests.x.saga")
def cancel_saga(ctx: Any, key: str) -> str:
    """Reserves, waits an hour, ships; a cancellation request releases the reservation
    (a durable step) and the run ends cancelled."""
    ctx.run(record, f"{key}:reserve")
    try:
        ctx.sleep("1h")
    except CancellationRequested:
        ctx.run(record, f"{key}:release")
        raise
    ctx.run(record, f"{key}:ship")
    return "shipped"


@workflow(name="tests.x.ignores")
def cancel_ignored(ctx: Any, key: str) -> str:
    """Never catches a cancellation: a request at its sleep ends the run."""
    ctx.run(record, f"{key}:before")
    ctx.sleep("1h")
    ctx.run(record, f"{key}:after")
    return "slept"


@workflow(name="tests.x.carries_on")
def cancel_carries_on(ctx: Any, key: str) -> dict[str, Any]:
    """Catches the request, records it, and completes normally after another wait."""
    try:
        ctx.sleep("1h")
        caught = None
    except WorkflowCancelled as exc:
        caught = exc.reason
    ctx.run(record, f"{key}:after")
    ctx.sleep(0.2)
    return {"caught": caught}


@workflow(name="tests.x.steps_then_sleep")
def steps_then_sleep(ctx: Any, steps: int = 5) -> int:
    """Inline steps, a sleep, inline steps: the turn the query-count test measures."""
    for i in range(steps):
        ctx.run(noop, i)
    ctx.sleep(0.2)
    for i in range(steps):
        ctx.run(noop, i)
    return steps


@activity(name="tests.x.q.watch", queue="tests", retry=NO_RETRY, timeout=60)
def watch(key: str, seconds: float, mode: str = "heartbeat") -> str:
    """Works until its run asks for cancellation: ``mode="heartbeat"`` calls heartbeat()
    (which raises), ``mode="poll"`` reads cancel_requested (set by the worker's heartbeat)."""
    info = activity_info()
    SideEffect.objects.create(key=f"{key}:started")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if mode == "heartbeat":
            try:
                info.heartbeat()
            except CancellationRequested as exc:
                SideEffect.objects.create(key=f"{key}:heartbeat raised: {exc.reason}")
                raise
        elif info.cancel_requested:
            SideEffect.objects.create(key=f"{key}:saw cancel_requested")
            return "stopped"
        time.sleep(0.05)
    return "ran out"


@workflow(name="tests.x.watching")
def watching(ctx: Any, key: str, seconds: float = 30, mode: str = "heartbeat") -> str:
    handle = ctx.start(watch, key, seconds, mode)
    try:
        return str(handle.result())
    except CancellationRequested:
        ctx.run(record, f"{key}:compensate")
        raise


@workflow(name="tests.x.parent")
def cancel_parent(ctx: Any, key: str) -> str:
    """Starts a child of each policy, each sleeping an hour, and completes."""
    for policy in ("request_cancel", "terminate", "abandon"):
        ctx.start_child(cancel_saga, f"{key}-{policy}", id=f"{key}-{policy}", parent_close_policy=policy)
    return "done"


@workflow(name="tests.x.continues")
def cancel_continues(ctx: Any, key: str, round: int = 0) -> str:
    """Continues as new before it blocks; its successor receives a request the first
    run did not."""
    ctx.run(record, f"{key}:{round}")
    if round == 0:
        ctx.continue_as_new(key, 1)
    try:
        ctx.sleep("1h")
    except CancellationRequested:
        ctx.run(record, f"{key}:release")
        raise
    return "done"


@workflow(name="tests.x.booking", finalizer=cleanup)
def cancel_booking(ctx: Any, key: str) -> str:
    """A finalizer's workflow that lets a cancellation request propagate."""
    ctx.set_finalizer_state({"key": key, "stage": "waiting"})
    ctx.on_update("note", lambda note: note)
    ctx.wait_signal("confirm")
    return "confirmed"


@workflow(name="tests.x.catches_then_fails")
def catches_then_fails(ctx: Any, key: str) -> None:
    """Catches the request at the wait for a queued activity, then waits for it again;
    the activity fails, and so does the run (at the activity's position, before the
    request's entry: a retry removes that entry)."""
    handle = ctx.start(queued_broken, key)
    try:
        handle.result()
    except CancellationRequested:
        ctx.run(record, f"{key}:caught")
    handle.result()


# -- reset -----------------------------------------------------------------------------

reset_bugs: dict[str, bool] = {"step_6": True}
"""The bug the reset tests fix: step 6 of ``tests.r.ten_steps`` raises while it is set.
A process test sets it with the environment (WEFT_TEST_RESET_FIXED=1 clears it)."""


@activity(name="tests.r.step", retry=NO_RETRY)
def reset_step(key: str, i: int, seconds: float = 0.0) -> int:
    """One SideEffect row per execution (``<key>:<i>``); step 6 fails until fixed."""
    if seconds:
        time.sleep(seconds)
    SideEffect.objects.create(key=f"{key}:{i}")
    fixed = os.environ.get("WEFT_TEST_RESET_FIXED") == "1" or not reset_bugs["step_6"]
    if i == 6 and not fixed:
        raise RuntimeError("a bug in step 6")
    return i


@workflow(name="tests.r.ten_steps")
def reset_ten_steps(ctx: Any, key: str, seconds: float = 0.0) -> int:
    return sum(ctx.run(reset_step, key, i, seconds) for i in range(10))


@workflow(name="tests.r.discount")
def reset_discount(ctx: Any, key: str) -> dict[str, Any]:
    """0: a step; 1: waits for "go", while an update "discount" may be applied (2, and its
    audit step 3); then steps "after" and 6 (which fails until fixed)."""
    state: dict[str, Any] = {"discount": 0}

    def discount(value: int) -> int:
        ctx.run(audit, f"{key}:audit", value)
        state["discount"] = value
        return value

    ctx.on_update("discount", discount)
    ctx.on_query("state", lambda: dict(state))
    ctx.run(record, f"{key}:before")
    ctx.wait_signal("go")
    ctx.run(record, f"{key}:after")
    ctx.run(reset_step, key, 6)
    return state


@workflow(name="tests.r.branch")
def reset_branch(ctx: Any, key: str, path: str = "record") -> str:
    """Its first step depends on its input: a reset with another ``path`` cannot replay it."""
    ctx.run(record if path == "record" else noop, f"{key}:first")
    ctx.run(record, f"{key}:second")
    ctx.sleep(3600)
    return path


@workflow(name="tests.r.signals")
def reset_signals(ctx: Any, key: str, count: int = 3) -> list[Any]:
    """Consumes ``count`` signals "item", recording a step after each."""
    received: list[Any] = []
    for i in range(count):
        received.append(ctx.wait_signal("item"))
        ctx.run(record, f"{key}:got-{i}")
    return received


@workflow(name="tests.r.parent")
def reset_parent(ctx: Any, key: str) -> dict[str, Any]:
    """0: a step; 1: a child that sleeps an hour (terminated when the parent closes); 2: waits."""
    ctx.run(record, f"{key}:parent")
    handle = ctx.start_child(child, key, 3600)
    return {"child": handle.result()}


@workflow(name="tests.r.attributes")
def reset_attributes(ctx: Any, key: str) -> str:
    ctx.set_search_attributes({"stage": "one"})
    ctx.run(record, f"{key}:one")
    ctx.set_search_attributes({"stage": "two"})
    ctx.wait_signal("go")
    return "done"


# -- the database and the broker going away (tests/integration/test_outages.py) ----------


@activity(name="tests.q.pause", queue="tests", retry=RetryPolicy(max_attempts=20, initial_interval=0.2))
def queued_pause(seconds: float) -> float:
    """Touches no table: every write around it is the engine's own."""
    time.sleep(seconds)
    return seconds


@workflow(name="tests.outlasts_outages")
def outlasts_outages(ctx: Any, rounds: int = 4, seconds: float = 0.5) -> int:
    """Rounds of an inline activity, a durable sleep and a queued activity, none of which
    writes a table of its own, so a run completes whatever moment an outage hits it."""
    for index in range(rounds):
        ctx.run(noop, index)
        ctx.sleep(seconds)
        ctx.run(queued_pause, 0.05)
    return rounds


from . import (  # noqa: E402, F401  (register the workflows of those tests)
    activity_flow_workflows,
    async_workflows,
    flow_workflows,
    last_step_workflows,
    observe_workflows,
    replay_workflows,
    task_workflows,
    traced_workflows,
)

# Workers started with WEFT_TEST_WITHOUT_LATE=1 lack these (tests of workers that do not
# have a workflow's code).
if os.environ.get("WEFT_TEST_WITHOUT_LATE") != "1":
    from . import late_workflows  # noqa: F401
