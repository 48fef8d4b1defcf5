"""Real threads for concurrency tests: each runs its part on a database connection of
its own, and closes it when done, so the test database can be dropped afterwards."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal, TypeVar, overload

from django.db import connections

T = TypeVar("T")


class ThreadsFailed(AssertionError):
    """Some threads raised, or did not end in time."""


@overload
def in_threads(
    target: Callable[[int], T], count: int, *, timeout: float = ..., return_exceptions: Literal[False] = ...
) -> list[T]: ...


@overload
def in_threads(
    target: Callable[[int], T], count: int, *, timeout: float = ..., return_exceptions: Literal[True]
) -> list[T | BaseException]: ...


def in_threads(
    target: Callable[[int], T], count: int, *, timeout: float = 60, return_exceptions: bool = False
) -> list[T] | list[T | BaseException]:
    """Run ``target(0)`` ... ``target(count - 1)`` at once, each in a thread of its own,
    and return what each returned, in that order. A thread that raised gives its
    exception as its result with ``return_exceptions``; without it, any exception (or a
    thread still running after ``timeout`` seconds) fails the test with all of them."""
    results: list[T | BaseException | None] = [None] * count
    raised: list[bool] = [False] * count

    def run(index: int) -> None:
        try:
            results[index] = target(index)
        except BaseException as exc:
            results[index], raised[index] = exc, True
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=run, args=(index,), name=f"in-threads-{index}") for index in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    stuck = [thread.name for thread in threads if thread.is_alive()]
    errors = [result for result, failed in zip(results, raised, strict=True) if failed]
    if stuck or (errors and not return_exceptions):
        raise ThreadsFailed(
            f"{len(stuck)} of {count} threads still running after {timeout} s; errors: {errors!r}"
        ) from (errors[0] if errors else None)
    return results  # type: ignore[return-value]
