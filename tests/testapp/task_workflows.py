"""Workflows whose steps are tasks of Django's task framework (``ctx.run(task, ...)``)."""

from __future__ import annotations

from typing import Any

from django_weft import workflow

from . import tasks


@workflow(name="tests.tasks.welcome")
def welcome(ctx: Any, user: str) -> dict[str, Any]:
    """Three tasks as steps: inline, on the "emails" queue, and one retried by its policy."""
    total = ctx.run(tasks.add, 2, 3)
    sent = ctx.run(tasks.send_email, user)
    attempt = ctx.run(tasks.fails_until, f"welcome:{user}", 2)
    return {"total": total, "sent": sent, "attempt": attempt}


@workflow(name="tests.tasks.immediate_step")
def immediate_step(ctx: Any, x: int) -> int:
    """A task of another backend (the framework's immediate one) as a recorded step."""
    return int(ctx.run(tasks.immediate_double, x))
