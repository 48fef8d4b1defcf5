"""docs/tutorial.md, done for real, in its order: the page's blocks build a throwaway
project in a temporary folder, and its commands run there.

Each block the page marks with an HTML comment (invisible on the site) is a step:

- ``<!-- file: PATH -->``: the block is that file's content;
- ``<!-- append: PATH -->``: the block is added at the end of that file;
- ``<!-- stdin: COMMAND -->``: COMMAND runs with the block as its input;
- ``<!-- run -->``: each line of the shell block runs, as the reader would type it:
  ``django-admin`` and ``python manage.py`` commands run (``runserver`` and
  ``weft_worker`` stay up in the background, the server on a free port), a ``curl``
  line's answer must have the status its comment names and, when the page shows the
  answers in a ``json`` block right after, match them (``"..."`` matches anything);
  ``pip install`` lines must name extras that exist and packages that are installed;
  the virtualenv line is the reader's (this test runs in its own);
- ``<!-- check: admin -->``: what the admin section tells the reader to see and do, done
  over HTTP (log in, the run list, the run's page, the order's page, Send signal).

A line the test does not know how to run fails it: a new kind of step needs a rule here.
The last step runs the page's own pytest file, with the ``weft`` fixture. Every address of
the development server the page names (the Swagger UI page) is opened while it runs, with
the scripts and styles it loads.

The REST reference's set-up blocks (docs/reference/rest.md, marked the same way) are run
in a project of their own, which then serves the schema pages.
"""

from __future__ import annotations

import base64
import http.cookiejar
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO, wait_for

PAGE = REPO / "docs" / "tutorial.md"
REST_PAGE = REPO / "docs" / "reference" / "rest.md"
STEP = re.compile(
    r"^<!-- (file|append|stdin|run|check)(?:: (.+?))? -->\n"
    r"(?:\n*```(\w*)\n(.*?)^```\n(?:\n```json\n(.*?)^```\n)?)?",
    re.MULTILINE | re.DOTALL,
)
STATUS_COMMENT = re.compile(r"\s+#\s*(\d{3})\s*$")
DEFAULT_ADDRESS = "127.0.0.1:8000"


@dataclass
class Step:
    kind: str
    target: str
    language: str
    body: str
    answers: list[str]
    line: int
    page: str = "docs/tutorial.md"

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.kind}{': ' + self.target if self.target else ''})"


def tutorial_steps(page: Path = PAGE) -> list[Step]:
    text = page.read_text()
    steps = []
    for match in STEP.finditer(text):
        kind, target, language, body, answers = match.groups()
        steps.append(
            Step(
                kind=kind,
                target=target or "",
                language=language or "",
                body=body or "",
                answers=[line for line in (answers or "").splitlines() if line.strip()],
                line=text.count("\n", 0, match.start()) + 1,
                page=str(page.relative_to(REPO)),
            )
        )
    return steps


def test_the_tutorial_marks_its_blocks() -> None:
    steps = tutorial_steps()
    kinds = [step.kind for step in steps]
    assert kinds.count("file") >= 7 and kinds.count("run") >= 6 and "check" in kinds
    for step in steps:
        assert step.kind == "check" or step.body, f"{step}: no code block follows the marker"
    # Every code block on the page is either a step or the answer a step shows.
    blocks = len(re.findall(r"^```\w+\n", PAGE.read_text(), re.MULTILINE))
    assert blocks == sum(1 for step in steps if step.body) + sum(1 for step in steps if step.answers)


@dataclass
class Project:
    """The reader's folder, terminals and browser."""

    root: Path
    env: dict[str, str]
    address: str
    background: list[subprocess.Popen[bytes]] = field(default_factory=list)
    tests: tuple[list[str], str] | None = None

    def run(self, argv: list[str], *, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            argv,
            cwd=self.root,
            env={**self.env, **(env or {})},
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{shlex.join(argv)} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def start(self, argv: list[str], name: str) -> None:
        log = (self.root / f"{name}.log").open("wb")
        self.background.append(
            subprocess.Popen(argv, cwd=self.root, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        )

    def url(self, path: str) -> str:
        return f"http://{self.address}{path}"

    def api(self, path: str) -> Any:
        request = urllib.request.Request(self.url(path), headers={"Authorization": _basic("admin", "admin")})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _free_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def _python(words: list[str]) -> list[str]:
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    if words[0] == "django-admin":
        return [sys.executable, "-m", "django", *words[1:]]
    raise AssertionError(f"not a python command: {shlex.join(words)}")


def _matches(expected: Any, actual: Any) -> bool:
    """``"..."`` in what the page shows stands for any value."""
    if expected == "...":
        return True
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and expected.keys() == actual.keys()
            and all(_matches(expected[key], actual[key]) for key in expected)
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(_matches(e, a) for e, a in zip(expected, actual, strict=True))
        )
    return bool(expected == actual)


def _commands(block: str) -> list[str]:
    return [line.strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def run_shell_step(project: Project, step: Step) -> None:
    commands = _commands(step.body)
    if step.answers:
        assert len(step.answers) == len(commands), f"{step}: one shown answer per command"
    for index, command in enumerate(commands):
        output = run_command(project, command, step)
        if step.answers:
            expected = json.loads(step.answers[index])
            if "weft_query" in command:
                # A read the reader may repeat: the worker takes a moment to get there.
                deadline = time.monotonic() + 30
                while not _matches(expected, output) and time.monotonic() < deadline:
                    time.sleep(0.2)
                    output = run_command(project, command, step)
            assert _matches(expected, output), (
                f"{step}: {command}\nanswered {output}\nthe page shows {expected}"
            )


def run_command(project: Project, command: str, step: Step) -> Any:
    where = f"{step}: {command}"
    if command == "python -m venv .venv && source .venv/bin/activate":
        return None  # the reader's virtualenv; this test runs in the suite's
    words = shlex.split(command, comments=True)
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if words[:2] == ["pip", "install"]:
        check_pip_install(words[2:], where)
        return None
    if words[0] == "curl":
        return run_curl(project, command, where)
    if words[:3] == ["python", "manage.py", "runserver"]:
        assert words[3:] == [], f"{where}: expected the default address"
        project.start(
            [sys.executable, "manage.py", "runserver", project.address, "--noreload"], name="runserver"
        )
        wait_for(lambda: _answers(project.url("/admin/login/")), 60, "the development server")
        return None
    if words[:3] == ["python", "manage.py", "weft_worker"]:
        project.start(_python(words), name="worker")
        return None
    if words[:3] == ["python", "-m", "pytest"]:
        project.tests = (words, where)  # the page's last step: run once the rest is checked
        return None
    if words[0] in ("python", "django-admin"):
        output = project.run(_python(words), env=env)
        if words[2:3] == ["weft_query"]:
            return json.loads(output)
        return output
    raise AssertionError(f"{where}: the tutorial test does not know how to run this line")


def check_pip_install(requirements: list[str], where: str) -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for requirement in requirements:
        name, _, rest = requirement.partition("[")
        if name == "django-weft":
            for extra in rest.rstrip("]").split(","):
                assert extra in extras, f"{where}: django-weft has no extra {extra!r}"
        else:
            module = name.replace("-", "_")
            assert __import__(module), f"{where}: {name} is not installed"


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def run_curl(project: Project, command: str, where: str) -> Any:
    status = STATUS_COMMENT.search(command)
    assert status, f"{where}: a curl line ends with the status it gets, as a comment (# 200)"
    words = shlex.split(command[: status.start()].replace(DEFAULT_ADDRESS, project.address))
    done = subprocess.run(
        [*words, "--silent", "--show-error", "--write-out", "\n%{http_code}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"{where}: curl failed: {done.stderr}"
    body, _, code = done.stdout.rpartition("\n")
    assert code == status.group(1), f"{where}: answered {code}, the page says {status.group(1)}: {body}"
    return json.loads(body) if body else None


def run_tutorial_tests(project: Project, words: list[str], where: str) -> None:
    output = project.run([*_python(words), "-p", "no:cacheprovider"])
    assert re.search(r"\b2 passed\b", output), f"{where}:\n{output}"


def check_admin(project: Project) -> None:
    """Section 6: log in, look at the run and the order, pack the order with Send signal."""
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))

    def get(path: str) -> str:
        with browser.open(project.url(path), timeout=30) as response:
            return str(response.read().decode())

    def post(path: str, form: dict[str, str]) -> str:
        token = next(cookie.value for cookie in jar if cookie.name == "csrftoken")
        data = urllib.parse.urlencode({**form, "csrfmiddlewaretoken": token}).encode()
        request = urllib.request.Request(project.url(path), data=data, headers={"Referer": project.url(path)})
        with browser.open(request, timeout=30) as response:
            return str(response.read().decode())

    get("/admin/login/")
    home = post("/admin/login/?next=/admin/", {"username": "admin", "password": "admin"})
    assert "Workflows" in home and "Workflow runs" in home and "Orders" in home

    run = wait_for(
        lambda: (run := project.api("/api/weft/runs/order-1/"))["status"] == "waiting" and run,
        30,
        "order-1's run to wait for its signal",
    )
    runs = get("/admin/django_weft/workflowrun/")
    assert "order-1" in runs and "weft-badge-waiting" in runs and "signal packed or timer" in runs
    page = get(f"/admin/django_weft/workflowrun/{run['run_id']}/change/")
    assert 'class="weft-timeline"' in page and "shop.charge" in page and "shop.mark_paid" in page
    order = get("/admin/shop/order/1/change/")
    assert "order 1 (paid)" in order and "receipt-" in order
    assert f"/admin/django_weft/workflowrun/{run['run_id']}/change/" in order

    form = get(f"/admin/django_weft/workflowrun/{run['run_id']}/signal/")
    assert "Send signal" in form
    sent = post(
        f"/admin/django_weft/workflowrun/{run['run_id']}/signal/", {"name": "packed", "payload": '"sam"'}
    )
    assert "Signal packed sent" in sent, sent
    result = project.api("/api/weft/runs/order-1/result/?wait=20")
    assert result["status"] == "completed" and result["result"]["packed_by"] == "sam"


SERVER_ADDRESS = re.compile(r"<http://127\.0\.0\.1:8000(/[^>]*)>")
ASSET = re.compile(r'(?:src|href)="(/static/[^"]+)"')


def fetch(project: Project, path: str) -> tuple[int, str]:
    """GET ``path`` from the project's server as the admin user (HTTP Basic)."""
    request = urllib.request.Request(project.url(path), headers={"Authorization": _basic("admin", "admin")})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def check_served_page(project: Project, path: str, where: str) -> str:
    """``path`` answers 200, and so does every script and style sheet it loads."""
    status, body = fetch(project, path)
    assert status == 200, f"{where}: {path} answered {status}: {body[:2000]}"
    for asset in ASSET.findall(body):
        asset_status, _ = fetch(project, asset)
        assert asset_status == 200, f"{where}: {path} loads {asset}, which answered {asset_status}"
    return body


def check_server_addresses(project: Project, page: Path) -> list[str]:
    """Every address of the development server that ``page`` names, opened."""
    text = page.read_text()
    paths = []
    for match in SERVER_ADDRESS.finditer(text):
        where = f"{page.relative_to(REPO)}:{text.count(chr(10), 0, match.start()) + 1}"
        check_served_page(project, match.group(1), where)
        paths.append(match.group(1))
    return paths


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "WEFT_"))}
    env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    folder = tmp_path / "shop-project"
    folder.mkdir()
    project = Project(root=folder, env=env, address=_free_address())
    yield project
    for process in project.background:
        process.send_signal(signal.SIGINT)
    for process in project.background:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.slow
@pytest.mark.database_independent  # the tutorial's own project and SQLite database
@pytest.mark.timeout(300)
def test_the_tutorial_works_as_written(project: Project) -> None:
    started = time.monotonic()
    for step in tutorial_steps():
        if step.kind == "file":
            path = project.root / step.target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(step.body)
        elif step.kind == "append":
            with (project.root / step.target).open("a") as file:
                file.write("\n" + step.body)
        elif step.kind == "stdin":
            project.run(_python(shlex.split(step.target)), stdin=step.body)
        elif step.kind == "check":
            assert step.target == "admin", f"{step}: unknown check"
            check_admin(project)
        else:
            run_shell_step(project, step)
    # Both orders went all the way.
    statuses = project.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            "from shop.models import Order; print([(o.pk, o.status) for o in Order.objects.order_by('pk')])",
        ]
    )
    assert statuses.strip().splitlines()[-1] == "[(1, 'shipped'), (2, 'shipped')]"
    # The addresses the page tells the reader to open while the server runs.
    opened = check_server_addresses(project, PAGE)
    assert "/api/weft/schema/swagger/" in opened
    assert time.monotonic() - started < 240
    assert project.tests is not None, "the tutorial ends with its tests"
    run_tutorial_tests(project, *project.tests)


@pytest.mark.slow
@pytest.mark.database_independent  # a project of its own, on SQLite
@pytest.mark.timeout(180)
def test_the_rest_reference_set_up_works_as_written(project: Project) -> None:
    """docs/reference/rest.md's set-up blocks, appended to a new project as the page says:
    the checks pass and the API and its schema pages answer, with their scripts."""
    text = REST_PAGE.read_text()
    steps = tutorial_steps(REST_PAGE)
    # Every python block of the page is one of these steps: each set-up snippet runs.
    assert len(steps) == len(re.findall(r"^```python\n", text, re.MULTILINE)) == 2
    project.run([sys.executable, "-m", "django", "startproject", "mysite", "."])
    for step in steps:
        assert step.kind == "append", f"{step}: the REST reference's steps are appended"
        with (project.root / step.target).open("a") as file:
            file.write("\n" + step.body)
    checked = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=project.root,
        env=project.env,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr
    assert "django_weft.E" not in checked.stdout + checked.stderr
    project.run([sys.executable, "manage.py", "migrate", "-v", "0"])
    project.run(
        [
            sys.executable,
            "manage.py",
            "createsuperuser",
            "--noinput",
            "--username",
            "admin",
            "--email",
            "admin@example.com",
        ],
        env={"DJANGO_SUPERUSER_PASSWORD": "admin"},
    )
    project.start([sys.executable, "manage.py", "runserver", project.address, "--noreload"], name="runserver")
    wait_for(lambda: _answers(project.url("/admin/login/")), 60, "the development server")
    swagger = check_served_page(project, "/api/weft/schema/swagger/", str(REST_PAGE))
    assert "swagger-ui-bundle.js" in swagger
    assert "redoc.standalone.js" in check_served_page(project, "/api/weft/schema/redoc/", str(REST_PAGE))
    status, schema = fetch(project, "/api/weft/schema/?format=json")
    assert status == 200 and json.loads(schema)["info"]["title"] == "django-weft API"
    status, runs = fetch(project, "/api/weft/runs/")
    assert status == 200 and json.loads(runs)["results"] == []
