"""The example project's own tests (``example_project/orders/tests/``: its workflows on
the ``weft`` fixture), run as a project runs them: ``pytest example_project`` in a child
process, with the example's settings and its root conftest turning the plugin on, on
the database this pass of the suite runs on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO


@pytest.mark.slow
def test_the_example_projects_workflow_tests_pass(tmp_path: Path, on_postgres: bool) -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"}
    }
    env.update(WEFT_EXAMPLE_VAR_DIR=str(tmp_path / "var"), PYTHONPATH=str(REPO))
    if on_postgres:
        # pytest-django creates (and drops) test_<name> next to the suite's own test database.
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")
        name = f"{os.environ.get('WEFT_TEST_PG_TEST_NAME', 'test_weft')}_example{worker}"
        host, port = os.environ.get("PGHOST", "127.0.0.1"), os.environ.get("PGPORT", "5432")
        env["DATABASE_URL"] = f"postgres://{os.environ.get('PGUSER', 'postgres')}@{host}:{port}/{name}"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "example_project"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "12 passed" in done.stdout, done.stdout[-2000:]
