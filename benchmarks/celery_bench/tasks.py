"""The baseline workload: a Celery chain of three no-op tasks, no durability.

The last link pushes ``"<chain id> <finish time>"`` to a Redis list, so the benchmark
can measure each chain's start-to-completion latency without a result backend."""

from __future__ import annotations

import time
from typing import Any

from celery import shared_task

_redis: list[Any] = []


def _client() -> Any:
    if not _redis:
        import redis
        from django.conf import settings

        _redis.append(redis.Redis.from_url(settings.CELERY_BROKER_URL))
    return _redis[0]


@shared_task(name="bench.chain_noop")
def chain_noop(value: int) -> int:
    return value


@shared_task(name="bench.chain_done")
def chain_done(value: int, chain_id: str) -> int:
    _client().rpush("bench:chains-done", f"{chain_id} {time.time()}")
    return value
