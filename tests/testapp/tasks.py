"""Tasks of Django's task framework, run by ``django_weft.tasks.WeftTaskBackend``
(``TASKS`` in tests/settings.py). Imported by the app's ready() like any app's tasks."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from django_weft import RetryPolicy
from django_weft.tasks.framework import TaskContext, task

from .models import SideEffect


def _mark(key: str) -> int:
    SideEffect.objects.create(key=key)
    return SideEffect.objects.filter(key=key).count()


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def named_like_the_engine(ctx: str, **more: Any) -> list[Any]:
    """Parameters named as the engine names its own (a workflow's ``ctx``, ``ctx.run``'s
    ``target``, ...): a task's own, passed by keyword."""
    return [ctx, more]


@task(priority=5)
def noop() -> None:
    return None


@task
def always_fails(message: str) -> None:
    raise ValueError(message)


@task(retry=RetryPolicy(max_attempts=3, initial_interval=0.01))
def fails_until(key: str, succeeds_on: int) -> int:
    """Fails until its ``succeeds_on``-th attempt; returns the attempt it succeeded on."""
    attempt = _mark(key)
    if attempt < succeeds_on:
        raise RuntimeError(f"attempt {attempt} of {key} fails")
    return attempt


@task(backend="retrying")
def retried_by_backend(key: str) -> int:
    """Fails twice, then succeeds: the "retrying" backend's policy (3 attempts) lets it."""
    attempt = _mark(key)
    if attempt < 3:
        raise ConnectionError(f"attempt {attempt} of {key} fails")
    return attempt


@task(takes_context=True)
def with_context(context: TaskContext, key: str) -> dict[str, Any]:
    _mark(key)
    seen = context.task_result
    return {"attempt": context.attempt, "id": seen.id, "status": str(seen.status)}


@task(takes_context=True, retry=RetryPolicy(max_attempts=2, initial_interval=0.01))
def context_on_retry(context: TaskContext, key: str) -> dict[str, Any]:
    """Fails its first attempt; the second sees ``attempt`` 2 and both workers."""
    attempt = _mark(key)
    if attempt < 2:
        raise RuntimeError("once more")
    return {"attempt": context.attempt, "workers": len(context.task_result.worker_ids)}


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task(queue_name="emails")
def send_email(to: str) -> str:
    _mark(f"email:{to}")
    return f"sent to {to}"


@task
def marks(key: str, seconds: float = 0.0) -> str:
    """Marks ``begin:<key>``, sleeps ``seconds``, marks ``end:<key>``."""
    _mark(f"begin:{key}")
    time.sleep(seconds)
    _mark(f"end:{key}")
    return key


@task(backend="immediate")
def immediate_double(x: int) -> int:
    return 2 * x


class WorkerCrash(BaseException):
    """Stands for a worker dying mid-attempt: nothing catches it, so the turn stops with
    the run still owned and its attempt marked as started."""


@task(takes_context=True, retry=RetryPolicy(max_attempts=2, initial_interval=0.01))
def crashes(context: TaskContext, key: str, crashes: int, then_fails: int = 0) -> int:
    """Its first ``crashes`` attempts "kill the worker", the next ``then_fails`` raise;
    returns the attempt it succeeded on (by its context: lost attempts count)."""
    attempt = context.attempt
    _mark(key)
    if attempt <= crashes:
        raise WorkerCrash(f"attempt {attempt} of {key}")
    if attempt <= crashes + then_fails:
        raise RuntimeError(f"attempt {attempt} of {key} fails")
    return attempt


@task(queue_name="emails", takes_context=True)
def crashes_on_queue(context: TaskContext, key: str) -> int:
    """On the "emails" queue: its first attempt "kills its worker"; no retry policy."""
    if context.attempt == 1:
        raise WorkerCrash(f"attempt 1 of {key}")
    return context.attempt


@task(retry=RetryPolicy(max_attempts=3, initial_interval=60))
def slow_retry() -> None:
    """Always fails; its next attempt waits a minute (a durable timer)."""
    raise RuntimeError("fails, retried in a minute")
