"""Which database alias the queries of a block went to, for the tests of
``WEFT_READ_DATABASE``: the suite's settings have a ``"replica"`` alias that mirrors the
default test database, as a read replica would (one database, two connections)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from django.apps import apps
from django.db import connections
from django.test.utils import CaptureQueriesContext

REPLICA = "replica"
BOTH = ["default", REPLICA]
"""The ``databases`` of a test that may touch both aliases."""


def weft_tables() -> frozenset[str]:
    return frozenset(model._meta.db_table for model in apps.get_app_config("django_weft").get_models())


@contextmanager
def weft_queries(*aliases: str) -> Iterator[dict[str, list[str]]]:
    """The statements naming a table of django_weft that each alias ran inside the block,
    filled in when the block ends (Django's own tables, sessions and users, are left out:
    they are the project's, on its own database)."""
    aliases = aliases or tuple(BOTH)
    found: dict[str, list[str]] = {alias: [] for alias in aliases}
    with ExitStack() as stack:
        captured = {
            alias: stack.enter_context(CaptureQueriesContext(connections[alias])) for alias in aliases
        }
        yield found
    tables = weft_tables()
    for alias, queries in captured.items():
        found[alias] = [query["sql"] for query in queries if any(table in query["sql"] for table in tables)]
