"""Work notices on PostgreSQL: ``NOTIFY`` when a run has work, ``LISTEN`` in a worker.

A process whose dispatcher rings no doorbell (a web process beside ``weft_worker``)
notifies in the transaction that made the work (a start, a signal, a resume): PostgreSQL
delivers the notice when that transaction commits and drops it if it rolls back, so a
listening worker claims the run at once instead of at its next sweep, and never for work
that did not happen. A notice is a hint: the sweep still finds every run, so a notice
lost with a listener's connection costs latency, not work.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import datetime

from .sql import StoreSql

NOTIFY_CHANNEL = "weft_work"
"""The channel of work notices."""

NOTICE_HORIZON = 60.0
"""Seconds ahead within which work due later is noticed (a short ``start_delay``, a
``run_after`` a moment away); work due later than that is left to the timers and the
sweep, so no listener holds a doorbell for it for days."""


def work_notice(run_id: str, priority: int = 0, eta: datetime | None = None) -> str:
    """A notice's payload: ``"<run id> <priority>"``, and ``" <eta>"`` (ISO 8601) for work
    due later."""
    notice = f"{run_id} {int(priority)}"
    return f"{notice} {eta.isoformat()}" if eta is not None else notice


def read_work_notice(payload: str) -> tuple[str, int, datetime | None] | None:
    """``(run_id, priority, eta)`` from a payload :func:`work_notice` wrote; ``None`` for
    anything else (another sender on the channel)."""
    parts = payload.split(" ")
    if len(parts) not in (2, 3):
        return None
    try:
        run_id = str(uuid.UUID(parts[0]))
        priority = int(parts[1])
        eta = datetime.fromisoformat(parts[2]) if len(parts) == 3 else None
    except ValueError:
        return None
    return run_id, priority, eta


class WorkNotices:
    """Listening for work notices (PostgreSQL only)."""

    def __init__(self, sql: StoreSql) -> None:
        self.sql = sql

    @property
    def available(self) -> bool:
        return self.sql.is_postgres

    def listen(
        self, stopped: Callable[[], bool], *, wait: float = 1.0
    ) -> Iterator[tuple[str, int, datetime | None]]:
        """The notices received, as ``(run_id, priority, eta)``, until ``stopped()``
        (checked every ``wait`` seconds at most). On a connection of its own, opened with
        the database's settings but outside Django's connection handling (and any pool it
        has), in autocommit, and closed when the listening ends: a pooled connection
        would go back to the pool still listening. A database error propagates (the
        caller listens again). Nothing may query this connection while it is listening:
        psycopg holds its lock while it waits for notices."""
        import psycopg

        params = dict(self.sql.connection.get_connection_params())
        params.pop("cursor_factory", None)  # Django's, for its own cursors
        raw = psycopg.connect(**params, autocommit=True)
        try:
            raw.execute(f"LISTEN {NOTIFY_CHANNEL}")
            while not stopped():
                for notice in raw.notifies(timeout=wait):
                    parsed = read_work_notice(notice.payload)
                    if parsed is not None:
                        yield parsed
        finally:
            raw.close()
