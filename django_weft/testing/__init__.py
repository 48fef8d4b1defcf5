"""Testing workflows: a pytest plugin with a time-skipping ``weft`` fixture, and helpers.

Nothing in django_weft imports this package. Turn the plugin on in the project's root
``conftest.py``::

    pytest_plugins = ["django_weft.testing"]

and use the ``weft`` fixture (see ``docs/how-to/testing-workflows.md``)::

    def test_the_trial_converts(weft):
        run = weft.start(trial, "ann@example.com")
        weft.advance("30d")
        weft.signal(run, "payment_method_added", {"card": "visa"})
        assert run.result() == "subscribed"

The fixture is :class:`~django_weft.testing.environment.WeftTestEnvironment`; its
virtual clock starts at the wall clock's time, or at what the ``weft_start_time``
fixture returns (override it in a ``conftest.py`` or a test module).

The helpers run on real time: :func:`drive` runs a run's turns until it finishes,
:func:`make_engine` makes an engine with its own identity, :func:`run_queued_activities`
and :func:`run_finalizer_now` run that work in this thread.

The Django parts are imported when first used, so the plugin also loads before Django is
set up (``pytest -p django_weft.testing``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .environment import ActivityMock, WeftBusy, WeftTestEnvironment
    from .helpers import drive, make_engine, run_finalizer_now, run_queued_activities

_LAZY = {
    "drive": "helpers",
    "make_engine": "helpers",
    "run_finalizer_now": "helpers",
    "run_queued_activities": "helpers",
    "ActivityMock": "environment",
    "WeftBusy": "environment",
    "WeftTestEnvironment": "environment",
}

__all__ = [
    "ActivityMock",
    "WeftBusy",
    "WeftTestEnvironment",
    "drive",
    "make_engine",
    "run_finalizer_now",
    "run_queued_activities",
    "weft",
    "weft_start_time",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def _weft_start_time() -> datetime | None:
    """When the ``weft`` fixture's virtual clock starts (a timezone-aware datetime);
    ``None``, the default, starts it at the wall clock's time. Override this fixture to
    pin the date a test runs on."""
    return None


def _weft(db: None, weft_start_time: datetime | None) -> Iterator[WeftTestEnvironment]:
    """Run workflows in this test's thread and database, synchronously, on a virtual
    clock of this test's own; activities can be replaced with ``weft.mock_activity``.
    Uses pytest-django's ``db`` (or ``transactional_db``, if the test asks for it)."""
    from .environment import WeftTestEnvironment

    with WeftTestEnvironment(start=weft_start_time) as environment:
        yield environment


try:
    import pytest
except ImportError:  # the helpers work without pytest; the fixtures need it
    pass
else:
    weft_start_time = pytest.fixture(name="weft_start_time")(_weft_start_time)
    weft = pytest.fixture(name="weft")(_weft)
