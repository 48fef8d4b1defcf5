"""The Celery dispatcher: doorbells become task messages, sent after commit."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from ...conf import weft_settings
from ...engine.run_logging import get_logger

logger = get_logger("django_weft.celery")

_PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


def message_priority(broker_url: str | None, priority: int) -> int | None:
    """Celery's message priority (0-9) for a run's ``priority`` (-100..100), where the
    broker orders by it; ``None`` to send none (the broker's default).

    The brokers' defaults differ, and a message sent without a priority keeps the
    default: RabbitMQ (queues declared with ``x-max-priority``) takes higher numbers
    first and a message without one last, so priorities above 0 are sent as 1-9; Redis
    (``priority_steps``) takes lower numbers first and a message without one first, so
    priorities below 0 are sent as 1-9. Other brokers get none."""
    scheme = (broker_url or "").split("://", 1)[0].split("+", 1)[0].lower()
    if scheme in ("amqp", "amqps", "pyamqp") and priority > 0:
        return -(-priority * 9 // 100)  # 1..100 -> 1..9, rounded up
    if scheme in ("redis", "rediss", "sentinel") and priority < 0:
        return -(priority * 9 // 100)  # -1..-100 -> 1..9, rounded up
    return None


class CeleryDispatcher:
    """Sends turns (on ``WEFT_CELERY_QUEUE``, or Celery's routing when unset) and queued
    activity attempts (on the activity's queue) as Celery tasks.

    Messages go out on commit of the surrounding transaction, if there is one. Sending is
    a latency hint: a broker that is down is logged and skipped, and the sweep sends the
    work again from the database once beat and the broker are back.
    """

    delivers = True
    max_eta = 300.0
    """Timer wake-ups further out than this (seconds) are left to the sweep alone, so
    workers do not hold far-future ETA messages in memory (or see them redelivered by a
    broker's visibility timeout)."""

    soft_limit_grace = 5.0
    """Seconds between an activity's soft time limit (its ``timeout``) and the hard kill."""

    takes_priority = True

    def dispatch_turn(self, run_id: str, *, eta: datetime | None = None, priority: int = 0) -> None:
        from .tasks import run_turn

        options: dict[str, Any] = {}
        level = message_priority(run_turn.app.conf.broker_url, priority)
        if level is not None:
            options["priority"] = level
        if weft_settings.CELERY_QUEUE:
            options["queue"] = weft_settings.CELERY_QUEUE
        if eta is not None:
            delay = (eta - timezone.now()).total_seconds()
            if delay > self.max_eta:
                return
            if delay > 0:
                options["eta"] = eta
        self._send(run_turn, (str(run_id),), options)

    def dispatch_activity(
        self, run_id: str, seq: int, attempt: int, *, queue: str, timeout: float | None = None
    ) -> None:
        from .tasks import run_activity

        # An empty queue (a finalizer of an inline activity) takes the default routing.
        options: dict[str, Any] = {"queue": queue} if queue else {}
        if timeout is not None:
            options["soft_time_limit"] = timeout
            options["time_limit"] = timeout + self.soft_limit_grace
        self._send(run_activity, (str(run_id), seq, attempt), options)

    def _send(self, task: Any, args: tuple[Any, ...], options: dict[str, Any]) -> None:
        def publish() -> None:
            try:
                sent = task.apply_async(args, retry=True, retry_policy=_PUBLISH_RETRY, **options)
                logger.debug("sent %s%r as %s", task.name, args, sent.id)
            except Exception as exc:
                logger.warning("could not send %s%r (%s); the sweep sends it again", task.name, args, exc)

        transaction.on_commit(publish, using=weft_settings.DATABASE_ALIAS)
