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


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database is away or busy rather than that a request was wrong."""
    return isinstance(exc, DATABASE_UNAVAILABLE)


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
