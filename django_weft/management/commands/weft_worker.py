"""``manage.py weft_worker``: run workflow turns and the sweep in-process, without Celery."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections, connections

from ... import runtime
from ...conf import weft_settings
from ...runtime.dispatch import LocalDispatcher, use_dispatcher
from ...runtime.heartbeat import Heartbeat

logger = logging.getLogger("django_weft.worker")


class Command(BaseCommand):
    help = (
        "Run workflow turns and queued activities (of every queue) with N threads, the "
        "scheduler sweep and the lease heartbeat in this process. SIGTERM or SIGINT stops it "
        "cleanly: running turns finish (or are released after --shutdown-timeout) before it exits."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--threads", type=int, default=4, help="turn threads (default 4)")
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            default=10.0,
            help="seconds to let running turns finish at shutdown before releasing them (default 10)",
        )
        parser.add_argument("--no-sweep", action="store_true", help="do not run the sweep in this process")
        parser.add_argument(
            "--log-level", default="INFO", help="level of the django_weft loggers (default INFO)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        threads = options["threads"]
        if threads < 1:
            raise CommandError("--threads must be at least 1")
        self._configure_logging(options["log_level"])
        worker = InProcessWorker(threads=threads, sweep=not options["no_sweep"])
        stop = threading.Event()

        def request_stop(signum: int, _frame: Any) -> None:
            logger.info("received %s, stopping", signal.Signals(signum).name)
            stop.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        worker.start()
        logger.info(
            "weft worker %s started: %d threads, tick every %gs, lease %gs renewed every %gs",
            worker.engine.engine_id,
            threads,
            weft_settings.TICK_INTERVAL,
            weft_settings.LEASE_TTL,
            weft_settings.LEASE_RENEW_INTERVAL,
        )
        while not stop.wait(0.5):
            pass
        released = worker.stop(options["shutdown_timeout"])
        logger.info("weft worker stopped (%d runs released)", len(released))

    @staticmethod
    def _configure_logging(level: str) -> None:
        weft_logger = logging.getLogger("django_weft")
        weft_logger.setLevel(level.upper())
        if not weft_logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            weft_logger.addHandler(handler)


class InProcessWorker:
    """Turn threads, a sweep thread and a heartbeat thread sharing one engine."""

    def __init__(self, *, threads: int, sweep: bool = True) -> None:
        self.dispatcher = LocalDispatcher()
        use_dispatcher(self.dispatcher)
        self.engine = runtime.get_engine()
        self._threads_wanted = threads
        self._sweep = sweep
        self._stopping = threading.Event()
        # Leases are renewed until the very end of a shutdown, so draining turns keep them.
        self._heartbeat = Heartbeat(self.engine)
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for index in range(self._threads_wanted):
            self._spawn(self._turn_loop, f"weft-turn-{index}")
        if self._sweep:
            self._spawn(self._sweep_loop, "weft-sweep")
        self._heartbeat.start()

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=self._guard(target), name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    @staticmethod
    def _guard(target: Any) -> Any:
        def run() -> None:
            try:
                target()
            finally:
                connections.close_all()

        return run

    def _turn_loop(self) -> None:
        while not self._stopping.is_set():
            work = self.dispatcher.get(timeout=0.2)
            if work is None:
                continue
            try:
                if work.seq is not None and work.attempt is not None:
                    runtime.run_activity(work.run_id, work.seq, work.attempt)
                else:
                    self.engine.run_turn(work.run_id)
            except Exception:
                logger.exception("run %s: %s crashed; it is retried after its lease expires", work.run_id,
                                 "activity" if work.is_activity else "turn")  # fmt: skip
                close_old_connections()

    def _sweep_loop(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self.dispatcher.release_due()
                # 0: a run sent elsewhere (say to Celery) but not yet claimed is taken
                # at once; this sweep's dispatches go to this process's own threads.
                runtime.tick(self.dispatcher, redispatch_after=0.0)
            except Exception:
                logger.exception("sweep failed; retrying")
                close_old_connections()
            interval = weft_settings.TICK_INTERVAL
            pause = interval - (time.monotonic() - started)
            next_due = self.dispatcher.next_due_in()
            if next_due is not None:
                pause = min(pause, next_due)
            self._stopping.wait(max(pause, 0.0))

    def stop(self, timeout: float) -> list[str]:
        """Stop taking work, let running turns finish up to ``timeout``, release the rest."""
        self._stopping.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread.name.startswith("weft-turn"):
                thread.join(max(deadline - time.monotonic(), 0))
        released = self.engine.release_all()
        self._heartbeat.stop()
        connections.close_all()
        use_dispatcher(None)
        return released
