"""Real worker processes against the test database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

REPO = Path(__file__).resolve().parents[2]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class WorkerProcess:
    """``manage.py weft_worker`` in a child process, on the test database."""

    def __init__(self, log_dir: Path, index: int, env: dict[str, str], args: list[str]) -> None:
        self.log_path = log_dir / f"worker-{index}.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "django", "weft_worker", "--log-level", "INFO", *args],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    @property
    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker did not exit within {timeout} s; log:\n{self.log}") from None

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self._log.close()


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


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class CeleryProcess:
    """A ``celery worker`` or ``celery beat`` in its own process group (so ``kill -9``
    takes its pool processes down with it), logging to a file."""

    def __init__(self, log_path: Path, argv: list[str], env: dict[str, str]) -> None:
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.celery_app", *argv],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def pool_pids(self) -> set[int]:
        """The pids of this worker's pool processes (its children)."""
        pids = set()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.pid:
                pids.add(int(stat.parent.name))
        return pids

    def wait_ready(self, timeout: float = 60) -> None:
        wait_for(lambda: " ready." in self.log or self.process.poll() is not None, timeout, "celery ready")
        if self.process.poll() is not None:
            raise AssertionError(f"celery exited with {self.process.returncode}:\n{self.log}")

    def kill(self) -> None:
        """SIGKILL the whole process group: no shutdown code runs anywhere."""
        if self.process.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        self.kill()
        self._log.close()


class CeleryCluster:
    """Starts Celery workers and beats against the test database and a broker."""

    def __init__(self, log_dir: Path, broker_url: str, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.broker_url = broker_url
        self.env = env
        self.processes: list[CeleryProcess] = []

    def _env(self, extra: dict[str, str] | None) -> dict[str, str]:
        env = dict(self.env)
        env.update(extra or {})
        return env

    def worker(self, concurrency: int = 4, queues: str = "celery,tests", **env: str) -> CeleryProcess:
        name = f"w{len(self.processes)}"
        argv = ["worker", "-Q", queues, "-c", str(concurrency), "-P", "prefork", "-l", "INFO", "-n",
                f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip
        process = CeleryProcess(self.log_dir / f"celery-{name}.log", argv, self._env(env))
        self.processes.append(process)
        return process

    def beat(self, **env: str) -> CeleryProcess:
        name = f"beat{len(self.processes)}"
        argv = ["beat", "-l", "INFO", "-s", str(self.log_dir / f"{name}-schedule"), "--max-interval", "1"]
        process = CeleryProcess(self.log_dir / f"celery-{name}.log", argv, self._env(env))
        self.processes.append(process)
        return process

    def logs(self) -> str:
        return "\n".join(f"==== {p.log_path.name}\n{p.log[-6000:]}" for p in self.processes)

    def stop(self) -> None:
        for process in self.processes:
            process.stop()


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
