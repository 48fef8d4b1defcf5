"""Real worker processes against the test database."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.support.processes import REPO, CeleryCluster, CeleryProcess, WorkerProcess
from tests.support.services import free_port

__all__ = ["REPO", "CeleryCluster", "CeleryProcess", "WorkerProcess", "free_port", "wait_for"]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start a worker process: ``start_worker(faults="point:action", threads=2, tick=None)``."""
    workers: list[WorkerProcess] = []
    settings_dict = connection.settings_dict

    def start(
        faults: str | None = None,
        threads: int = 2,
        tick: float | None = None,
        args: tuple[str, ...] = (),
        env_vars: dict[str, str] | None = None,
    ) -> WorkerProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        env.update(
            DJANGO_SETTINGS_MODULE="tests.settings",
            PYTHONPATH=str(REPO),
            WEFT_TEST_DB="sqlite" if connection.vendor == "sqlite" else "postgres",
        )
        if connection.vendor == "sqlite":
            env["WEFT_TEST_SQLITE_NAME"] = str(settings_dict["NAME"])
        else:
            env["WEFT_TEST_PG_NAME"] = str(settings_dict["NAME"])
        env.pop("WEFT_FAULTS", None)
        if faults:
            env["WEFT_FAULTS"] = faults
        if tick is not None:
            env["WEFT_TEST_TICK_INTERVAL"] = str(tick)
        env.update(env_vars or {})
        worker = WorkerProcess(tmp_path, len(workers), env, ["--threads", str(threads), *args])
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


# -- Celery worker and beat processes ------------------------------------------------------


def celery_env(broker_url: str, **extra: str) -> dict[str, str]:
    settings_dict = connection.settings_dict
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONPATH=str(REPO),
        WEFT_TEST_DB="postgres",
        WEFT_TEST_PG_NAME=str(settings_dict["NAME"]),
        WEFT_TEST_CELERY="1",
        WEFT_TEST_BROKER_URL=broker_url,
        WEFT_LOG_LEVEL="INFO",
    )
    env.pop("WEFT_FAULTS", None)
    env.update(extra)
    return env


@pytest.fixture
def broker_url() -> str:
    """The machine's Redis (database 15 by default), emptied for the test."""
    url = os.environ.get("WEFT_TEST_BROKER_URL", "redis://127.0.0.1:6379/15")
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    except redis.ConnectionError as exc:
        raise AssertionError(
            f"the Celery tests need Redis at {url} ({exc}); start it or set WEFT_TEST_BROKER_URL"
        ) from None
    finally:
        client.close()
    return url


@pytest.fixture
def celery_cluster(tmp_path: Path, broker_url: str) -> Iterator[CeleryCluster]:
    from django.test import override_settings

    from django_weft.runtime.dispatch import _instantiate

    cluster = CeleryCluster(tmp_path, broker_url, celery_env(broker_url))
    use_broker(broker_url)
    _instantiate.cache_clear()
    try:
        with override_settings(WEFT_DISPATCHER="django_weft.contrib.celery.dispatch.CeleryDispatcher"):
            yield cluster
    finally:
        cluster.stop()
        use_broker(os.environ.get("WEFT_TEST_BROKER_URL", "redis://127.0.0.1:6379/15"))


def use_broker(url: str) -> None:
    """Point this process's Celery app (which sends the test's messages) at ``url``."""
    from kombu import pools

    from tests.celery_app import app

    pools.reset()  # closes and forgets every cached connection and producer pool
    app._pool = None
    app.amqp._producer_pool = None
    app.conf.broker_url = url
