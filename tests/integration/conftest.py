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
        faults: str | None = None, threads: int = 2, tick: float | None = None, args: tuple[str, ...] = ()
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
        worker = WorkerProcess(tmp_path, len(workers), env, ["--threads", str(threads), *args])
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()
