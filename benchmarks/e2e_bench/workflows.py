"""The workload: K inline no-op steps per run."""

from __future__ import annotations

from django_weft import WorkflowContext, activity, workflow


@activity(name="bench.noop")
def noop(value: int) -> int:
    return value


@workflow(name="bench.steps")
def steps(ctx: WorkflowContext, count: int) -> int:
    for index in range(count):
        ctx.run(noop, index)
    return count


@workflow(name="bench.first_step")
def first_step(ctx: WorkflowContext) -> int:
    """One step: start → first step is the whole run."""
    return ctx.run(noop, 1)


@workflow(name="bench.signal_loop")
def signal_loop(ctx: WorkflowContext, count: int) -> int:
    """Waits for ``count`` signals ``ping``, one at a time."""
    for _ in range(count):
        ctx.wait_signal("ping")
    return count


@workflow(name="bench.parked")
def parked(ctx: WorkflowContext, hours: float) -> int:
    """Sleeps ``hours``, then one step (``parked.py``: a run parked on a timer)."""
    ctx.sleep(hours * 3600)
    return ctx.run(noop, 1)


@workflow(name="bench.awaits_signal")
def awaits_signal(ctx: WorkflowContext) -> int:
    """Waits for the signal ``go`` (``parked.py``: a run parked on a signal)."""
    ctx.wait_signal("go")
    return ctx.run(noop, 1)
