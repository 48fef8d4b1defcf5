"""The example project's stack (``scripts/run-example``: Celery worker, beat and the web
server on SQLite and the embedded filesystem broker) under load, as a new user runs it.

No test database: the stack is a separate project with its own state folder.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, wait_for

# The example runs on its own SQLite database and broker folder, whichever the suite's.
pytestmark = [pytest.mark.slow, pytest.mark.database_independent]

ORDERS = 200
THREADS = 4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _example_env(state: Path, port: int) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"}
    }
    env.update(
        WEFT_EXAMPLE_VAR_DIR=str(state),
        PORT=str(port),
        DJANGO_SETTINGS_MODULE="example_project.settings",
        PYTHONUNBUFFERED="1",
    )
    return env


def _start_stack(
    tmp_path: Path, state: Path, log_level: str = "WARNING"
) -> tuple[dict[str, str], subprocess.Popen[bytes], Path]:
    """``scripts/run-example`` in its own session (so the test can stop all of it)."""
    env = {**_example_env(state, _free_port()), "WEFT_LOG_LEVEL": log_level}
    log_path = tmp_path / "run-example.log"
    with log_path.open("wb") as log:
        stack = subprocess.Popen(
            ["bash", "scripts/run-example"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return env, stack, log_path


def _wait_until_up(stack: subprocess.Popen[bytes], log_path: Path) -> None:
    wait_for(
        lambda: "Ctrl-C stops" in log_path.read_text(errors="replace") or stack.poll() is not None,
        120,
        "the example stack to come up",
        interval=0.5,
    )


# Its own bounds (the stack's start, the orders' 240 s, the stop) exceed the suite's
# default per-test timeout, which would cut it short on a loaded machine.
@pytest.mark.timeout(420)
def test_the_example_stack_completes_200_orders_under_cpu_load_and_no_process_dies(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env, stack, log_path = _start_stack(tmp_path, state)
    burner = None
    try:
        _wait_until_up(stack, log_path)
        assert stack.poll() is None, log_path.read_text(errors="replace")[-4000:]
        # Another process keeps a core busy meanwhile (bounded: it stops by itself).
        burn = "import time\nend = time.monotonic() + 240\nwhile time.monotonic() < end: pass"
        burner = subprocess.Popen([sys.executable, "-c", burn])
        load = subprocess.run(
            [
                sys.executable,
                "manage.py",
                "demo_order",
                "--count",
                str(ORDERS),
                "--threads",
                str(THREADS),
                "--slot",
                "dock 1",
                "--wait",
                "240",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=360,
        )
        stack_log = log_path.read_text(errors="replace")
        assert load.returncode == 0, f"{load.stdout}\n{load.stderr}\n--- stack:\n{stack_log[-6000:]}"
        assert f"{ORDERS} completed" in load.stdout, load.stdout
        # run-example exits as soon as any of its three processes does (wait -n).
        assert stack.poll() is None, stack_log[-6000:]
        assert "has stopped" not in stack_log
        assert "Unrecoverable error" not in stack_log
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
        if stack.poll() is None:
            os.killpg(stack.pid, signal.SIGTERM)
            try:
                stack.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(stack.pid, signal.SIGKILL)
                stack.wait()
    # Ctrl-C-like stop: the script stopped its processes and said so.
    assert "stopping the worker, beat and the server" in log_path.read_text(errors="replace")


def test_run_example_names_the_process_that_died_and_shows_its_last_lines(tmp_path: Path) -> None:
    state = tmp_path / "state"
    # At INFO beat logs each tick it sends (its default, WARNING, logs nothing to quote).
    _, stack, log_path = _start_stack(tmp_path, state, log_level="INFO")
    try:
        _wait_until_up(stack, log_path)
        beat_log = state / "logs" / "beat.log"
        wait_for(
            lambda: "Sending due task" in beat_log.read_text(errors="replace"), 60, "beat to send a tick"
        )
        beat_pid = _pid_of(stack.pid, "beat")
        os.kill(beat_pid, signal.SIGKILL)
        stack.wait(60)
    finally:
        if stack.poll() is None:
            os.killpg(stack.pid, signal.SIGKILL)
            stack.wait()
    output = log_path.read_text(errors="replace")
    assert "Celery beat has stopped (exit status 137)" in output, output[-4000:]
    assert f"its last log lines ({state}/logs/beat.log)" in output
    # The report quotes beat's own log, ending with its last line.
    last_line = beat_log.read_text(errors="replace").strip().splitlines()[-1].strip()
    assert last_line in output.split("Celery beat has stopped", 1)[1]
    assert "stopping the worker, beat and the server" in output


def _pid_of(parent: int, word: str) -> int:
    """The child of ``parent`` whose command line contains ``word``."""
    for child in subprocess.run(
        ["pgrep", "-P", str(parent)], capture_output=True, text=True, check=False
    ).stdout.split():
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        if word in cmdline.split():
            return int(child)
    raise AssertionError(f"no child of {parent} runs {word!r}")
