"""The durable workload: a workflow of three inline no-op activities."""

from __future__ import annotations

from django_weft import WorkflowContext, activity, workflow


@activity(name="bench.noop")
def noop(value: int) -> int:
    return value


@workflow(name="bench.three_steps")
def three_steps(ctx: WorkflowContext, value: int) -> int:
    for _ in range(3):
        value = ctx.run(noop, value)
    return value


@workflow(name="bench.steps")
def steps(ctx: WorkflowContext, value: int, count: int) -> int:
    """``count`` inline no-op activities (``celery_throughput.py --steps``)."""
    for _ in range(count):
        value = ctx.run(noop, value)
    return value


@workflow(name="bench.signal_loop")
def signal_loop(ctx: WorkflowContext, count: int) -> int:
    """Consumes ``count`` signals "ping", one wait each."""
    for _ in range(count):
        ctx.wait_signal("ping")
    return count


@workflow(name="bench.counter")
def counter(ctx: WorkflowContext) -> int:
    """Answers update "bump" with the new count until update "stop"."""
    state = {"count": 0, "stopped": False}

    def bump(by: int) -> int:
        state["count"] += by
        return state["count"]

    def stop(_payload: object) -> int:
        state["stopped"] = True
        return state["count"]

    ctx.on_update("bump", bump)
    ctx.on_update("stop", stop)
    ctx.wait_condition(lambda: state["stopped"])
    return state["count"]
