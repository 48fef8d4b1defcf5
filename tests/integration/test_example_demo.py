"""``scripts/run-example`` as a reader meets it: the README's steps, followed in order
against the running demo, all answer as the README says (no 409 for a run that already
shipped), and the console stays the demo's own: no more than one line a second that the
demo did not print itself.

The demo's own lines are the script's (its ``==>`` lines, the order it starts, the
instructions it prints) and what the example's workflows and app log. Everything else
(Celery's and the server's output, django_weft's own log lines) counts against the bound.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from .conftest import REPO, wait_for
from .test_example_stack import _example_env, _free_port

pytestmark = [pytest.mark.slow, pytest.mark.database_independent]

SCRIPT = REPO / "scripts" / "run-example"
README = REPO / "README.md"


def demo_line_patterns() -> list[re.Pattern[str]]:
    """What the demo prints itself: the script's instructions (its here-document, with
    each ``$variable`` standing for anything), its ``==>`` lines, the demo order's own
    output and the example app's log lines."""
    script = SCRIPT.read_text()
    heredoc = script.split("cat <<EOT\n", 1)[1].split("\nEOT\n", 1)[0]
    patterns = [
        re.compile(re.sub(r"\\\$\w+", ".*", re.escape(line)) + "$") for line in heredoc.splitlines() if line
    ]
    patterns += [
        re.compile(r"==> "),
        re.compile(r"created the demo superuser$"),
        re.compile(r"order \d+ created for .+, \d+\.\d\d$"),
        re.compile(r"(workflow|run) id: \S+$"),
        # settings.LOGGING's format, from the workflows (ctx.logger) and the orders app.
        re.compile(r"\d{4}-\d\d-\d\d [\d:,]+ (INFO|WARNING) (django_weft\.workflow\.|example_project\.)"),
    ]
    return patterns


def readme_steps() -> list[str]:
    """The command lines of the README's two blocks of things to try while the demo runs."""
    blocks = re.findall(r"^```sh\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)
    tried = [block for block in blocks if "weft_query order-1" in block or "api/weft/runs/" in block]
    assert len(tried) == 2, "the README's blocks to try against the demo moved"
    return [line.strip() for block in tried for line in block.splitlines() if line.strip()]


class Console:
    """run-example's output, line by line, with the time each line arrived."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[tuple[float, str]] = []
        assert process.stdout is not None
        self._stdout = process.stdout
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def run_readme_line(line: str, env: dict[str, str], port: int) -> None:
    """One line of the README, as the reader types it from the repository root."""
    command, _, comment = line.partition("   #") if line.startswith("curl") else (line, "", "")
    words = shlex.split(command.replace("127.0.0.1:8000", f"127.0.0.1:{port}"), comments=True)
    if words[0] == "curl":
        done = subprocess.run(
            [*words, "--silent", "--show-error", "--write-out", "\n%{http_code}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"{line}\n{done.stderr}"
        body, _, status = done.stdout.rpartition("\n")
        said = re.search(r"\b(\d{3})\b", comment)
        assert said, f"the README's curl line says the status it gets: {line}"
        assert status == said.group(1), f"{line}\nanswered {status}: {body}"
        return
    assert words[0] == ".venv/bin/python", line
    deadline = time.monotonic() + 60
    while True:
        done = subprocess.run(words, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        # A query right after the start may come before the run's first turn: the reader
        # would ask again.
        if done.returncode == 0 or "weft_query" not in line or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"


@pytest.mark.timeout(420)
def test_the_readme_steps_work_in_order_on_a_quiet_console(tmp_path: Path) -> None:
    port = _free_port()
    env = _example_env(tmp_path / "state", port)
    env.pop("WEFT_LOG_LEVEL", None)  # the script's default, as a reader runs it
    began = time.monotonic()
    stack = subprocess.Popen(
        ["bash", str(SCRIPT)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    console = Console(stack)
    try:
        wait_for(
            lambda: "Ctrl-C stops" in console.text() or stack.poll() is not None,
            180,
            "the demo to come up",
            interval=0.5,
        )
        assert stack.poll() is None, console.text()
        up = time.monotonic()
        # The reader reads the instructions for a while: the console stays quiet meanwhile.
        time.sleep(10)
        for line in readme_steps():
            run_readme_line(line, env, port)
        ended = time.monotonic()
        assert stack.poll() is None, console.text()
    finally:
        if stack.poll() is None:
            os.killpg(stack.pid, signal.SIGINT)  # Ctrl-C
            try:
                stack.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(stack.pid, signal.SIGKILL)
                stack.wait()
    patterns = demo_line_patterns()
    foreign = [
        (at, line)
        for at, line in console.lines
        if at <= ended and line.strip() and not any(pattern.match(line) for pattern in patterns)
    ]
    shown = "\n".join(line for _, line in foreign)
    # Over the whole demo, fewer lines than seconds ...
    assert len(foreign) <= ended - began, f"{len(foreign)} lines in {ended - began:.0f} s:\n{shown}"
    # ... and, once it is up, no second with more than one.
    after_up = [at for at, _ in foreign if at > up]
    crowded = [at for at in after_up if sum(1 for other in after_up if at <= other < at + 1) > 1]
    assert not crowded, f"more than one line a second not printed by the demo:\n{shown}"
    # The workflows' own lines are there: the demo order and the README's order-2 shipped.
    text = console.text()
    assert "order 1 shipped as parcel-1 from dock 3" in text
    assert "order 2 shipped as parcel-2 from dock 2" in text
