"""The test project's processes on a PostgreSQL cluster of the test's own.

The outage tests stop and crash the database under a web server, a ``weft_worker`` and
Celery, so all of them run on a :class:`~tests.support.services.PrivatePostgres`: its
database is migrated here, runs are started by a Python process of the project, and the
test reads the outcome with plain SQL.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from tests.support.processes import REPO, GroupProcess
from tests.support.services import PrivatePostgres, free_port
from tests.support.waiting import wait_until

DATABASE = "weft"
ADMIN = ("operator", "operator-password")


class PrivateProject:
    """``tests.settings`` pointed at database ``weft`` of ``cluster``."""

    def __init__(self, cluster: PrivatePostgres) -> None:
        self.cluster = cluster

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "WEFT_"))}
        env.update(
            DJANGO_SETTINGS_MODULE="tests.settings",
            PYTHONPATH=str(REPO),
            PYTHONUNBUFFERED="1",
            WEFT_TEST_DB="postgres",
            WEFT_TEST_PG_NAME=DATABASE,
            PGHOST=self.cluster.host,
            PGPORT=str(self.cluster.port),
            PGUSER=self.cluster.user,
        )
        env.update(extra)
        return env

    def setup(self) -> None:
        """Create and migrate the database, with a superuser ``ADMIN``."""
        self.cluster.create_database(DATABASE)
        self.manage("migrate", "--no-input", "-v", "0")
        self.python(
            "from django.contrib.auth.models import User\n"
            f"User.objects.create_superuser({ADMIN[0]!r}, 'operator@example.com', {ADMIN[1]!r})"
        )

    def manage(self, *argv: str) -> str:
        return self._run([sys.executable, "-m", "django", *argv])

    def python(self, code: str) -> str:
        """Run ``code`` in a new process of the project (after ``django.setup()``); its output."""
        return self._run([sys.executable, "-c", f"import django\ndjango.setup()\n{code}"])

    def _run(self, argv: list[str]) -> str:
        done = subprocess.run(argv, cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise AssertionError(f"{argv[2:]} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def start_runs(self, workflow: str, runs: int, **kwargs: Any) -> list[str]:
        """Start ``runs`` runs of ``workflow`` with ``kwargs``; their run ids."""
        out = self.python(
            "from django_weft import client\n"
            f"for index in range({runs}):\n"
            f"    print(client.start({workflow!r}, kwargs={kwargs!r}).run_id)"
        )
        return out.split()

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(
            host=self.cluster.host, port=self.cluster.port, user=self.cluster.user, dbname=DATABASE,
            connect_timeout=5,
        ) as conn:  # fmt: skip
            return conn.execute(query, params).fetchall()

    def statuses(self, run_ids: list[str]) -> dict[str, str]:
        rows = self.sql(
            "SELECT id::text, status FROM django_weft_workflowrun WHERE id::text = ANY(%s)", run_ids
        )
        return dict(rows)

    def steps_recorded(self, run_ids: list[str]) -> int:
        rows = self.sql("SELECT count(*) FROM django_weft_step WHERE run_id::text = ANY(%s)", run_ids)
        return int(rows[0][0])

    def wait_completed(self, run_ids: list[str], timeout: float, logs: Any = "") -> None:
        def all_completed() -> bool:
            try:
                return set(self.statuses(run_ids).values()) == {"completed"}
            except psycopg.OperationalError:
                return False

        try:
            wait_until(all_completed, f"{len(run_ids)} runs to complete", timeout=timeout, interval=0.2)
        except AssertionError:
            counts: dict[str, int] = {}
            for status in self.statuses(run_ids).values():
                counts[status] = counts.get(status, 0) + 1
            raise AssertionError(f"runs by status: {counts}\n{logs() if callable(logs) else logs}") from None


class ServerProcess(GroupProcess):
    """``manage.py runserver`` without threads or reloader: one process and one thread
    serve every request, so a persistent database connection is reused by all of them."""

    def __init__(self, project: PrivateProject, log_path: Path, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "django", "runserver", "--noreload", "--nothreading",
                f"127.0.0.1:{self.port}"]  # fmt: skip
        super().__init__(log_path, argv, project.env(**env))
        wait_until(self._answers, "the web server to answer", timeout=60)

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the web server exited with {self.process.returncode}:\n{self.log}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False


class WorkerProcess(GroupProcess):
    """``manage.py weft_worker`` on the project's database."""

    def __init__(self, project: PrivateProject, log_path: Path, threads: int = 2, **env: str) -> None:
        argv = [sys.executable, "-m", "django", "weft_worker", "--threads", str(threads)]
        super().__init__(log_path, argv, project.env(**env))
