"""The runtime from async code, and waiting for an outcome.

A wait (``result()``, ``update()`` and their awaited twins) is a *look*, one short
autocommit read that returns the outcome, raises the outcome's error, or says what to
look at next, repeated with a growing pause until the outcome is there or the time is
up (:func:`wait_for`, :func:`await_for`). The look is the same function for a blocking
and an awaiting caller; only the pause differs: ``time.sleep`` or ``await asyncio.sleep``.

Which thread, and so which database connection (Django's belong to the thread that
opened them), each awaited call uses:

- Awaited looks run one at a time on one thread of their own (``_looks``), whatever
  the number of waits, event loops or requests they serve, so every awaited wait in the
  process reads through that thread's one connection, and no wait holds a thread or a
  connection while it pauses. ``thread_sensitive=True`` would not give that: under
  Django's ASGI handler each request has a sync thread of its own
  (``ThreadSensitiveContext``), so 200 requests waiting would read through 200
  connections; ``thread_sensitive=False`` with the loop's default executor would keep
  one connection open per pool thread. The looks' connection is given back, as Django
  gives a request's back (closed unless ``CONN_MAX_AGE`` keeps it), when the last
  awaited wait of the process ends, cancelled or not.
- A call that reads or writes once (``astart``, ``asignal``, an update's acceptance...)
  runs on the caller's sync thread (``thread_sensitive=True``, as Django's async ORM
  calls run: in an ASGI request, the request's), and gives that thread's connection back
  the same way when it returns, unless a transaction is open on it (:func:`once`). So a
  view that starts a run and then awaits its result holds no connection while it waits.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import wraps
from typing import Any, Generic, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

from ..conf import weft_settings

K = TypeVar("K")
P = ParamSpec("P")
R = TypeVar("R")


def once(function: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """``function`` to await: called on the caller's sync thread (asgiref's
    ``sync_to_async``, ``thread_sensitive=True``), which then gives its connection back
    (closed unless ``CONN_MAX_AGE`` keeps it; never inside a transaction)."""

    @wraps(function)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        finally:
            _give_connection_back()

    return sync_to_async(call, thread_sensitive=True)


def _give_connection_back() -> None:
    connection = connections[weft_settings.DATABASE_ALIAS]
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()


@dataclass(frozen=True)
class Backoff:
    """The pauses between looks: ``first``, then each ``factor`` times the last, at most
    ``cap`` seconds."""

    first: float
    cap: float
    factor: float = 1.5

    def pauses(self) -> Iterator[float]:
        pause = self.first
        while True:
            yield pause
            pause = min(pause * self.factor, self.cap)


RESULT_BACKOFF = Backoff(first=0.01, cap=0.25)
"""Waiting for a run's result: a run's outcome is usually seconds away."""
UPDATE_BACKOFF = Backoff(first=0.002, cap=0.1)
"""Waiting for an update's outcome: a parked run applies it within milliseconds."""


@dataclass(frozen=True)
class Pending(Generic[K]):
    """A look that found no outcome yet: what to look at next (``key``: the same, or a
    continued run's successor...) and the error a wait raises when its time is up."""

    key: K
    expired: Callable[[float], Exception]
    """Given the wait's length in seconds: ``ResultTimeout``, ``UpdateTimeout``..."""


@dataclass(frozen=True)
class Found:
    """A look that found the outcome."""

    value: Any


Look = Callable[[K], "Found | Pending[K]"]
"""One short read: the outcome (:class:`Found`), its error (raised), or :class:`Pending`."""


def wait_for(look: Look[K], key: K, timeout: float | None, backoff: Backoff) -> Any:
    """Look until the outcome is found, pausing by ``backoff`` in this thread; raise the
    pending look's error after ``timeout`` seconds (``None``: no limit)."""
    began = time.monotonic()
    for pause in backoff.pauses():
        looked = look(key)
        if isinstance(looked, Found):
            return looked.value
        key = looked.key
        time.sleep(_pause_or_expire(looked, pause, began, timeout))
    raise AssertionError("unreachable: pauses() never ends")


async def await_for(look: Look[K], key: K, timeout: float | None, backoff: Backoff) -> Any:
    """:func:`wait_for` for a coroutine: each look runs on the looks' thread, and the
    pause is an ``asyncio.sleep``, so between looks the wait holds no thread and no
    connection. Cancelling the awaiting task leaves nothing behind: a look already
    running finishes its read (it writes nothing) and its answer is dropped."""
    began = time.monotonic()
    _looks.begin()
    try:
        for pause in backoff.pauses():
            looked = await _look_async(look, key)
            if isinstance(looked, Found):
                return looked.value
            key = looked.key
            await asyncio.sleep(_pause_or_expire(looked, pause, began, timeout))
        raise AssertionError("unreachable: pauses() never ends")
    finally:
        _looks.end()


def _pause_or_expire(looked: Pending[K], pause: float, began: float, timeout: float | None) -> float:
    """The pause before the next look, cut to the time left; raise the pending look's
    error when no time is left."""
    if timeout is None:
        return pause
    remaining = began + timeout - time.monotonic()
    if remaining <= 0:
        raise looked.expired(timeout)
    return min(pause, remaining)


class _LookThread:
    """The thread awaited looks run on, its connection, and how many awaited waits are
    going on (to give the connection back when none is)."""

    def __init__(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weft-looks")
        self._lock = threading.Lock()
        self._waits = 0

    def begin(self) -> None:
        with self._lock:
            self._waits += 1

    def end(self) -> None:
        with self._lock:
            self._waits -= 1
            idle = self._waits == 0
        if idle:
            # Queued behind any look still running, on the thread that owns the connection.
            self.executor.submit(self._release_if_idle)

    @property
    def waits(self) -> int:
        with self._lock:
            return self._waits

    def look(self, look: Look[K], key: K) -> Found | Pending[K]:
        connection = connections[weft_settings.DATABASE_ALIAS]
        # A connection broken by an earlier look (a database restart) is replaced now,
        # not carried into every wait that follows.
        if connection.connection is not None and connection.errors_occurred and not connection.is_usable():
            connection.close()
        return look(key)

    def _release_if_idle(self) -> None:
        if self.waits == 0:
            _give_connection_back()


_looks = _LookThread()


async def _look_async(look: Look[K], key: K) -> Found | Pending[K]:
    return await sync_to_async(_looks.look, thread_sensitive=False, executor=_looks.executor)(look, key)


def awaited_waits() -> int:
    """How many awaited waits are going on in this process (for tests and diagnostics)."""
    return _looks.waits
