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
