"""Test the package on newer interpreters and Django releases: ``nox -s tests``.

Each session runs the part of the suite that leans on Django and DRF the most (the
task framework's backend, the admin, the REST API's flows, runs, migrations and system
checks; not the engine, which imports no Django), without the process-level tests
(``slow``), the schema fuzzing (``fuzz``) and the browser tests (``browser``), which the
baseline run of ``scripts/test`` covers with everything else; except the task
framework's process tests, so that Django 6's ``django.tasks`` is tested in full. To keep
the test command within its time budget, Python 3.12 runs it on PostgreSQL with Django
6.1, and 3.13 runs the task framework's part (its tests and process tests) on SQLite
with Django 6.0 (the baseline interpreter runs everything on both databases, with
Django 5.2 and the framework's backport); ``WEFT_NOX_DJANGO=6.1`` picks one release for
every session; ``WEFT_NOX_ALL_DATABASES=1`` runs the
whole subset on both databases everywhere, and ``nox -s tests -- tests`` runs the whole
suite (paths after ``--`` replace the subset; other options apply to it). Interpreters
that are not installed are skipped (``nox`` reports them), so the command works on any
machine.
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = False
nox.options.reuse_existing_virtualenvs = True


SKIPPED = "not slow and not fuzz and not browser"
SUBSET = [
    "tests/tasks",  # Django's task framework: django.tasks on Django 6, in full
    "tests/admin",
    "tests/api/test_flow.py",
    "tests/runtime/test_runs.py",
    "tests/store/test_schema_and_checks.py",
]
"""What a session runs unless paths are given after ``--``."""
TASK_PROCESSES = ["tests/integration/test_task_processes.py"]
"""Process-level tests a session runs beside the subset (Django 6's ``django.tasks``)."""
DATABASES = {"3.12": ("postgres",), "3.13": ("sqlite",)}
"""The databases each interpreter's session runs the suite on."""
TASKS_ONLY = {"3.13"}
"""Interpreters whose session runs only the task framework's tests of the subset."""
DJANGO = {"3.12": "6.1", "3.13": "6.0"}
"""The Django release each interpreter's session tests (``WEFT_NOX_DJANGO`` overrides):
6.1 under the subset, 6.0 under the task framework (its ``@task`` passes no options to
the backend, the one difference the backend meets)."""


@nox.session(python=["3.12", "3.13"])
def tests(session: nox.Session) -> None:
    django = os.environ.get("WEFT_NOX_DJANGO") or DJANGO.get(str(session.python), "6.1")
    session.install("-e", ".[dev]", f"Django~={django}.0")
    session.run("python", "-c", "import django; print('Django', django.get_version())")
    # A test database of its own, so sessions never collide with another run of the suite.
    test_db = "test_weft_" + session.name.split("(")[0].replace("-", "_").replace(".", "")
    databases = DATABASES.get(str(session.python), ("postgres", "sqlite"))
    subset = ["tests/tasks"] if str(session.python) in TASKS_ONLY else SUBSET
    if os.environ.get("WEFT_NOX_ALL_DATABASES") == "1":
        databases, subset = ("postgres", "sqlite"), SUBSET
    for database in databases:
        env = {"WEFT_TEST_DB": database, "WEFT_TEST_PG_TEST_NAME": test_db}
        # Options after "--" (-k, -x) apply to the subset; a path there replaces it.
        paths_given = any(arg.startswith("tests") for arg in session.posargs)
        targets = list(session.posargs) if paths_given else [*subset, *session.posargs]
        parallel = ["-n", "2", "--dist", "loadfile"]  # two pytest-xdist workers
        session.run("pytest", "-q", "-p", "no:cacheprovider", *parallel, "-m", SKIPPED, *targets, env=env)
        if not paths_given:
            # The task framework in full: its process-level tests (a worker killed mid-task) too.
            session.run("pytest", "-q", "-p", "no:cacheprovider", *TASK_PROCESSES, env=env)
