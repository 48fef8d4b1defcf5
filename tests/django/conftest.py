from __future__ import annotations

from collections.abc import Iterator

import pytest

from .helpers import Driver


@pytest.fixture
def driver() -> Iterator[Driver]:
    """A worker thread driving every runnable run (and the sweep) while the test runs."""
    worker = Driver()
    yield worker
    worker.stop()
