"""Waiting for a state another thread or process reaches, instead of sleeping a guess."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    condition: Callable[[], object], what: str, timeout: float = 20.0, interval: float = 0.05
) -> None:
    """Return as soon as ``condition()`` is true; fail naming ``what`` after ``timeout`` seconds.

    The deadline only bounds a test that would otherwise hang: a slow machine takes longer
    to get there, it does not make the test pass or fail differently.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"still waiting after {timeout} s until {what}")
        time.sleep(interval)
