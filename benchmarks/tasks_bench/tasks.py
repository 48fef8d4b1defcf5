"""The same no-op task three times: for django_weft's backend (``default``), for
django-tasks-db (``db``) and for Celery.

The framework's backends record when a task finished. Celery keeps no result here
(``CELERY_TASK_IGNORE_RESULT``), so its task pushes ``"<key> <finish time>"`` to a Redis
list instead: one ``RPUSH`` on the broker's connection pool."""

from __future__ import annotations

import time
from typing import Any

from celery import shared_task

try:
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

CELERY_DONE_KEY = "bench:tasks-done"

_redis: list[Any] = []


def _client() -> Any:
    if not _redis:
        import redis
        from django.conf import settings

        _redis.append(redis.Redis.from_url(settings.CELERY_BROKER_URL))
    return _redis[0]


@task(backend="default")
def noop(value: int) -> int:
    return value


@task(backend="db")
def noop_db(value: int) -> int:
    return value


@shared_task(name="bench.tasks_noop")
def celery_noop(value: int) -> int:
    _client().rpush(CELERY_DONE_KEY, f"{value} {time.time()}")
    return value
