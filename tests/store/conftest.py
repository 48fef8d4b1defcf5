"""Fixtures of the store's tests."""

from tests.support.notices import listener  # noqa: F401  (a fixture for the tests here)
