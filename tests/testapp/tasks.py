"""Tasks of Django's task framework, run by ``django_weft.tasks.WeftTaskBackend``
(``TASKS`` in tests/settings.py). Imported by the app's ready() like any app's tasks."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

from django_weft import RetryPolicy
from django_weft.tasks import framework
from django_weft.tasks.framework import TaskContext, task

from .models import SideEffect

TASK_TAKES_OPTIONS = any(
    parameter.kind is inspect.Parameter.VAR_KEYWORD
    for parameter in inspect.signature(task).parameters.values()
)
"""Whether the framework's ``@task`` passes options it does not know (``retry=``) on to
the backend's task class: Django 6.1 and the backport do, Django 6.0 does not."""


def retrying_task(policy: RetryPolicy, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``@task(retry=policy, **options)``; on Django 6.0, whose ``@task`` cannot pass the
    policy on, the backend's task class (``WeftTask``) made as ``@task`` makes it, with it."""

    def make(function: Callable[..., Any]) -> Any:
        if TASK_TAKES_OPTIONS:
            return task(retry=policy, **options)(function)
        from django.tasks.base import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_PRIORITY  # Django 6.0

        backend = options.get("backend", DEFAULT_TASK_BACKEND_ALIAS)
        return framework.task_backends[backend].task_class(
            func=function,
            retry=policy,
            priority=options.get("priority", DEFAULT_TASK_PRIORITY),
            queue_name=options.get("queue_name", framework.DEFAULT_TASK_QUEUE_NAME),
            backend=backend,
            takes_context=options.get("takes_context", False),
            run_after=None,
        )

    return make


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


@retrying_task(RetryPolicy(max_attempts=3, initial_interval=0.01))
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


@retrying_task(RetryPolicy(max_attempts=2, initial_interval=0.01), takes_context=True)
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


@retrying_task(RetryPolicy(max_attempts=2, initial_interval=0.01), takes_context=True)
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


@retrying_task(RetryPolicy(max_attempts=3, initial_interval=60))
def slow_retry() -> None:
    """Always fails; its next attempt waits a minute (a durable timer)."""
    raise RuntimeError("fails, retried in a minute")
