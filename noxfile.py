"""Test the package on newer interpreters and Django releases: ``nox -s tests``.

Each session runs the suite on PostgreSQL and SQLite, without the process-level tests
(marked ``slow``: real worker, Celery and broker processes) and the schema fuzzing
(``fuzz``), which the baseline run of ``scripts/test`` covers. Interpreters that are not
installed are skipped (``nox`` reports them), so the command works on any machine.
"""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = False
nox.options.reuse_existing_virtualenvs = True


@nox.session(python=["3.12", "3.13"])
@nox.parametrize("django", ["6.1"])
def tests(session: nox.Session, django: str) -> None:
    session.install("-e", ".[dev]", f"Django~={django}.0")
    session.run("python", "-c", "import django; print('Django', django.get_version())")
    # A test database of its own, so sessions never collide with another run of the suite.
    test_db = "test_weft_" + session.name.split("(")[0].replace("-", "_").replace(".", "")
    for database in ("postgres", "sqlite"):
        env = {"WEFT_TEST_DB": database, "WEFT_TEST_PG_TEST_NAME": test_db}
        session.run(
            "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow and not fuzz and not browser", *session.posargs, env=env
        )
