"""A connection listening for work notices, as ``weft_worker``'s listening thread does,
beside a web process's dispatcher (one that delivers nothing): the notices a test's
starts and signals send on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from django_weft.runtime.dispatch import SweepOnlyDispatcher, use_dispatcher
from django_weft.store.notices import NOTIFY_CHANNEL


@pytest.fixture
def listener() -> Iterator[psycopg.Connection[Any]]:
    """A connection listening on the workers' channel, with this process's dispatcher a
    web process's beside ``weft_worker``."""
    use_dispatcher(SweepOnlyDispatcher())
    params = dict(connection.get_connection_params())
    params.pop("cursor_factory", None)
    listening = psycopg.connect(**params, autocommit=True)
    listening.execute(f"LISTEN {NOTIFY_CHANNEL}")
    try:
        yield listening
    finally:
        listening.close()
        use_dispatcher(None)


def notices(listening: psycopg.Connection[Any], timeout: float = 1.0) -> list[str]:
    """The payloads of the notices received within ``timeout`` seconds."""
    return [notice.payload for notice in listening.notifies(timeout=timeout)]
