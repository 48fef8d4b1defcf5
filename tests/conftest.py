from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection

from django_weft.engine import faults
from tests.support.driver import Driver

# The weft fixture (django_weft.testing), as a project turns it on in its root conftest.
pytest_plugins = ["django_weft.testing"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.conf import settings

    on_postgres = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
    skip = pytest.mark.skip(reason="needs PostgreSQL (WEFT_TEST_DB=postgres)")
    once = pytest.mark.skip(reason="independent of the test database: runs in the SQLite pass")
    for item in items:
        if "postgres" in item.keywords and not on_postgres:
            item.add_marker(skip)
        if "database_independent" in item.keywords and on_postgres:
            item.add_marker(once)


@pytest.fixture(autouse=True)
def _disarm_faults() -> Iterator[None]:
    yield
    faults.disarm()


@pytest.fixture
def on_postgres() -> bool:
    return bool(connection.vendor == "postgresql")


@pytest.fixture
def driver() -> Iterator[Driver]:
    """A worker thread driving every runnable run (and the sweep) while the test runs."""
    worker = Driver()
    yield worker
    worker.stop()
