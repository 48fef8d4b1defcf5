"""The lease heartbeat of a worker process.

Every ``WEFT_LEASE_RENEW_INTERVAL`` it extends the leases of the runs this process's
engine drives and of the queued activity attempts this process runs, and tells those
attempts whose run asked for cancellation (``activity_info().cancel_requested``). One
heartbeat thread per process: ``weft_worker`` starts it explicitly, Celery worker processes start
it on their first task (:func:`ensure_heartbeat`), whatever the pool. In a worker process
(:func:`~.workers.advertise_as`) each beat also advertises what the process can run.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from django.db import close_old_connections, connections

from ..conf import weft_settings
from ..engine.attempt import CancelProbe
from ..engine.executor import Engine
from ..engine.run_logging import get_logger
from .process import get_engine, get_store
from .workers import advertise_now

logger = get_logger("django_weft.heartbeat")

Attempt = tuple[str, int, int]

_running_lock = threading.Lock()
_running: dict[Attempt, int] = {}
_probes: dict[Attempt, list[CancelProbe]] = {}


@contextlib.contextmanager
def running_attempt(run_id: str, seq: int, attempt: int, probe: CancelProbe | None = None) -> Iterator[None]:
    """Mark a queued activity attempt as running in this process while the block runs,
    so the heartbeat renews its lease (and, given its ``probe``, tells it when its run
    asks for cancellation)."""
    key = (str(run_id), seq, attempt)
    with _running_lock:
        _running[key] = _running.get(key, 0) + 1
        if probe is not None:
            _probes.setdefault(key, []).append(probe)
    try:
        yield
    finally:
        with _running_lock:
            if _running[key] == 1:
                del _running[key]
            else:
                _running[key] -= 1
            if probe is not None:
                _probes[key].remove(probe)
                if not _probes[key]:
                    del _probes[key]


def running_attempts() -> list[Attempt]:
    with _running_lock:
        return list(_running)


def _unaware_probes() -> dict[tuple[str, int], list[CancelProbe]]:
    """The probes of running attempts not yet told to stop, by ``(run_id, seq)``."""
    with _running_lock:
        found: dict[tuple[str, int], list[CancelProbe]] = {}
        for (run_id, seq, _), probes in _probes.items():
            for probe in probes:
                if probe.why is None:
                    found.setdefault((run_id, seq), []).append(probe)
        return found


def tell_cancellations() -> int:
    """Tell the running attempts whose run asked for cancellation (one read for all of
    them); returns how many were told."""
    probes = _unaware_probes()
    if not probes:
        return 0
    told = 0
    for key, why in get_store().attempts.cancellations_requested(list(probes)).items():
        for probe in probes.get(key, []):
            probe.why = why
            told += 1
    return told


class Heartbeat:
    """A daemon thread renewing this process's leases until stopped."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="weft-heartbeat", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def beat(self) -> None:
        """Renew everything once, then advertise what this worker can run (the loop calls
        this; tests may too)."""
        self.engine.renew_leases()
        held = bool(self.engine.held())
        attempts = running_attempts()
        if attempts:
            get_store().attempts.renew_activities(attempts, weft_settings.LEASE_TTL)
            tell_cancellations()
        self._advertise()
        if not attempts and not held:
            # Idle: do not keep a database connection open between bursts of work.
            connections.close_all()

    @staticmethod
    def _advertise() -> None:
        try:
            advertise_now()
        except Exception:
            # Leases matter more: an advert that fails is written again at the next beat.
            logger.warning("could not advertise this worker; retrying at the next beat", exc_info=True)
            close_old_connections()

    def _loop(self) -> None:
        try:
            # At once, so a worker that has just started is listed before its first beat.
            self._advertise()
            while not self._stop.wait(weft_settings.LEASE_RENEW_INTERVAL):
                try:
                    self.beat()
                except Exception:
                    logger.exception("lease renewal failed; retrying")
                    close_old_connections()
        finally:
            connections.close_all()


_process_lock = threading.Lock()
_process_heartbeat: tuple[int, Heartbeat] | None = None


def ensure_heartbeat() -> Heartbeat:
    """Start this process's heartbeat if it is not running (safe after ``fork``: a
    child process starts its own)."""
    global _process_heartbeat
    with _process_lock:
        current = _process_heartbeat
        if current is not None and current[0] == os.getpid() and current[1].alive:
            return current[1]
        heartbeat = Heartbeat(get_engine())
        heartbeat.start()
        _process_heartbeat = (os.getpid(), heartbeat)
        return heartbeat


def stop_heartbeat() -> None:
    global _process_heartbeat
    with _process_lock:
        current, _process_heartbeat = _process_heartbeat, None
    if current is not None and current[0] == os.getpid():
        current[1].stop()
