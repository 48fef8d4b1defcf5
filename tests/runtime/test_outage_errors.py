"""Which database errors are an outage (503, retry later) and which are a bug to see: the
errors are raised by the real database, on both."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection, transaction
from django.db.utils import DatabaseError

from django_weft.runtime.outages import database_unavailable

pytestmark = pytest.mark.django_db


def _error_of(sql: str) -> DatabaseError:
    with pytest.raises(DatabaseError) as raised, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql)
    return raised.value


def test_a_missing_table_is_a_bug_not_an_outage() -> None:
    # An unapplied migration: OperationalError on SQLite, ProgrammingError on PostgreSQL.
    assert not database_unavailable(_error_of("SELECT * FROM django_weft_no_such_table"))


def test_a_statement_the_database_refuses_is_a_bug_not_an_outage() -> None:
    assert not database_unavailable(_error_of("SELEC 1"))


@pytest.mark.postgres
def test_a_statement_timeout_is_busy_and_retried_later() -> None:
    with pytest.raises(DatabaseError) as raised, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL statement_timeout = 10")
        cursor.execute("SELECT pg_sleep(1)")
    assert database_unavailable(raised.value)


def test_a_locked_sqlite_database_is_busy_and_retried_later(tmp_path: Path) -> None:
    import sqlite3

    from django.db.utils import OperationalError

    path = tmp_path / "locked.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        other = sqlite3.connect(path, timeout=0.01)
        with pytest.raises(sqlite3.OperationalError) as raised:
            other.execute("SELECT * FROM t")
        wrapped = OperationalError(*raised.value.args)
        wrapped.__cause__ = raised.value  # as Django's error wrapper raises it
        assert database_unavailable(wrapped)
    finally:
        holder.execute("ROLLBACK")
