"""The database going away, as the surfaces and the worker processes see it.

The REST API answers 503 and the admin a page saying so (docs/reference/rest.md,
docs/how-to/admin.md), instead of a 500; worker processes drop the connection the
database closed and carry on with a new one once it answers again
(docs/explanation/guarantees.md, "When the database or the broker goes away").
"""

from __future__ import annotations

from django.db import connections
from django.db.utils import InterfaceError, OperationalError

DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)
"""What Django raises when the database cannot be reached or drops the connection (and
for a statement cancelled or a lock not granted in time: busy, try again)."""

RETRY_AFTER = 5
"""Seconds a client is told to wait (``Retry-After``) before trying again."""

MESSAGE = "The database is not answering; try again in a few seconds."


_UNAVAILABLE_SQLSTATE_CLASSES = ("08", "40", "53", "55", "57", "58")
"""PostgreSQL's error classes that mean "away or busy, try again": connection exception,
transaction rollback (deadlock, serialization), insufficient resources, object not in
prerequisite state (a lock not available), operator intervention (shutdown, a statement
timeout), system error."""
_UNAVAILABLE_SQLITE_WORDS = ("locked", "busy", "unable to open", "disk i/o")


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database is away or busy rather than that the code or its
    schema is wrong. An ``OperationalError`` that names a missing table or column (an
    unapplied migration on SQLite) or a statement the database refuses is a bug to see,
    not an outage to wait out."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate is not None:  # psycopg: the server answered with an error code
        return str(sqlstate)[:2] in _UNAVAILABLE_SQLSTATE_CLASSES
    if type(cause).__module__.startswith("sqlite3"):
        message = str(cause).lower()
        return any(word in message for word in _UNAVAILABLE_SQLITE_WORDS)
    return True  # no code: the connection failed before the server could answer


def drop_broken_connections() -> list[str]:
    """Close this thread's database connections that failed since their last use and no
    longer answer; returns their aliases.

    Django does this around each HTTP request (``close_old_connections``), but a worker
    process that keeps its connections between tasks (``CELERY_DB_REUSE_MAX``,
    ``CONN_MAX_AGE``) would otherwise keep a connection the database has closed and fail
    every task on it until the process is restarted. A connection that works, or that
    saw no error, is left open: this never costs a reconnection.
    """
    dropped = []
    for connection in connections.all(initialized_only=True):
        if connection.connection is None or not connection.errors_occurred:
            continue
        if connection.in_atomic_block:
            continue  # the block's owner decides; its exit rolls back or closes
        if connection.is_usable():
            connection.errors_occurred = False
            continue
        connection.close()
        dropped.append(connection.alias)
    return dropped
