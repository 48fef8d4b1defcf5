"""Worker processes of the process-level tests: ``manage.py weft_worker``, ``celery worker``
and ``celery beat``, each in a process group of its own and logging to a file.

A process group of its own means a SIGKILL or SIGSTOP sent to the group reaches a Celery
worker's pool processes too, as it would when a machine or a container goes away, and a
Ctrl-C in the terminal does not reach them (whoever started them stops them).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]


class GroupProcess:
    """A child process leading a process group of its own, logging to ``log_path``."""

    def __init__(self, log_path: Path, argv: list[str], env: dict[str, str]) -> None:
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            argv,
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

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the leader only (a clean stop: SIGTERM, SIGINT)."""
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the whole group (SIGKILL, SIGSTOP, SIGCONT)."""
        if self.process.poll() is None:
            os.killpg(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL the whole process group: no shutdown code runs anywhere. A stopped
        group is killed too (SIGKILL needs no SIGCONT)."""
        if self.process.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)
            self.process.wait(10)
        else:
            # The leader is gone; a pool process it left behind may still be in the group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)

    def stop(self) -> None:
        self.kill()
        self._log.close()


class WorkerProcess(GroupProcess):
    """``manage.py weft_worker`` (run as ``python -m django``) on the settings ``env`` names."""

    def __init__(self, log_dir: Path, index: int, env: dict[str, str], args: list[str]) -> None:
        argv = [sys.executable, "-m", "django", "weft_worker", "--log-level", "INFO", *args]
        super().__init__(log_dir / f"worker-{index}.log", argv, env)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker did not exit within {timeout} s; log:\n{self.log}") from None


class CeleryProcess(GroupProcess):
    """A ``celery worker`` or ``celery beat`` of the app ``tests.celery_app``."""

    def __init__(self, log_path: Path, argv: list[str], env: dict[str, str]) -> None:
        super().__init__(log_path, [sys.executable, "-m", "celery", "-A", "tests.celery_app", *argv], env)

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
        wait_until(
            lambda: " ready." in self.log or self.process.poll() is not None, "celery is ready", timeout
        )
        if self.process.poll() is not None:
            raise AssertionError(f"celery exited with {self.process.returncode}:\n{self.log}")


class CeleryCluster:
    """Starts Celery workers and beats on a broker, with the environment ``env``."""

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
