"""``manage.py weft_worker``: run workflow turns and the sweep in-process, without Celery."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...conf import weft_settings
from ...engine.registry import registry
from ...runtime import InProcessWorker, freeze_loaded_objects
from ._arguments import log_level, positive, seconds

logger = logging.getLogger("django_weft.worker")

MAX_THREADS = 256
"""More turn threads than this would only queue on the database's connections."""


class Command(BaseCommand):
    help = (
        "Run workflow turns and queued activities (of every queue) with N threads, the "
        "scheduler sweep and the lease heartbeat in this process. SIGTERM or SIGINT stops it "
        "cleanly: running turns finish (or are released after --shutdown-timeout) before it exits."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--threads", type=positive, default=4, help=f"turn threads (default 4, at most {MAX_THREADS})"
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=seconds,
            default=10.0,
            help="seconds to let running turns finish at shutdown before releasing them (default 10)",
        )
        parser.add_argument("--no-sweep", action="store_true", help="do not run the sweep in this process")
        parser.add_argument(
            "--log-level",
            type=log_level,
            default="INFO",
            help="level of the django_weft loggers (default INFO)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        threads = options["threads"]
        if threads > MAX_THREADS:
            raise CommandError(f"--threads must be at most {MAX_THREADS}; got {threads}")
        self._configure_logging(options["log_level"])
        worker = InProcessWorker(threads=threads, sweep=not options["no_sweep"])
        freeze_loaded_objects()  # Django, the apps and the workflows are loaded
        stop = threading.Event()

        def request_stop(signum: int, _frame: Any) -> None:
            logger.info("received %s, stopping", signal.Signals(signum).name)
            stop.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        worker.start()
        workflows = registry.workflow_names()
        logger.info(
            "weft worker %s started: %d threads, tick every %gs, lease %gs renewed every %gs, "
            "%d workflows registered",
            worker.engine.engine_id,
            threads,
            weft_settings.TICK_INTERVAL,
            weft_settings.LEASE_TTL,
            weft_settings.LEASE_RENEW_INTERVAL,
            len(workflows),
        )
        if not workflows:
            logger.warning(
                "no workflow is registered in this process, so it runs none: check "
                "WEFT_AUTODISCOVER_MODULE and INSTALLED_APPS (each app's %s module is imported)",
                weft_settings.AUTODISCOVER_MODULE,
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
