"""A connection the database closed is dropped before the next task uses it.

PostgreSQL ends the connection of a worker's thread (``pg_terminate_backend``, as a
restart does); that thread's next queries fail until something closes the connection.
Django closes it around HTTP requests only; :func:`drop_broken_connections` (called
before every django_weft Celery task) does it for worker processes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.utils import OperationalError

from django_weft.contrib.celery import signals
from django_weft.contrib.celery.tasks import tick
from django_weft.models import WorkflowRun
from django_weft.runtime.outages import database_unavailable, drop_broken_connections

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def in_thread(body: Callable[[], Any]) -> Any:
    """``body()`` in a thread of its own (its own connection); its result or its error."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(body())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    return outcome[0]


def backend_of_a_thread_then(*steps: Callable[[], Any]) -> list[Any]:
    """Run ``steps`` in one worker thread, the database ending its connection first."""
    results: list[Any] = []
    ready, terminated = threading.Event(), threading.Event()
    pid: list[int] = []

    def worker() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid.append(cursor.fetchone()[0])
        ready.set()
        terminated.wait(30)
        for step in steps:
            try:
                results.append(step())
            except Exception as exc:
                results.append(exc)
        connection.close()

    thread = threading.Thread(target=worker)
    thread.start()
    assert ready.wait(30)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid[0]])
    terminated.set()
    thread.join(30)
    return results


def count_runs() -> int:
    return WorkflowRun.objects.count()


def count_runs_atomically() -> int:
    with transaction.atomic():
        return WorkflowRun.objects.count()


def test_a_dead_connection_keeps_failing_until_it_is_dropped_then_the_next_query_works() -> None:
    before, still, dropped, after = backend_of_a_thread_then(
        count_runs, count_runs_atomically, drop_broken_connections, count_runs_atomically
    )
    assert isinstance(before, OperationalError) and database_unavailable(before)
    # What a worker process saw before: every later task failed on the same connection.
    assert isinstance(still, OperationalError), still
    assert dropped == ["default"]
    assert after == 0


def test_the_celery_hook_drops_it_before_a_django_weft_task_only() -> None:
    other_task = type("Task", (), {"name": "project.other"})()
    results = backend_of_a_thread_then(
        count_runs,
        lambda: signals.drop_broken_connections(sender=other_task),
        count_runs,
        lambda: signals.drop_broken_connections(sender=tick),
        count_runs,
    )
    assert isinstance(results[0], OperationalError)
    assert isinstance(results[2], OperationalError), "a project's task is left alone"
    assert results[4] == 0


def test_a_working_connection_is_kept_even_after_an_error() -> None:
    def error_then_drop() -> tuple[Any, list[str], int]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT * FROM no_such_table")
        except Exception as exc:
            error = exc
        dropped = drop_broken_connections()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            same = cursor.fetchone()[0] == pid
        connection.close()
        return error, dropped, same

    error, dropped, same = in_thread(error_then_drop)
    assert connection.vendor == "postgresql" and error is not None
    assert dropped == [] and same
