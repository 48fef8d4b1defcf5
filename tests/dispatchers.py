"""Dispatchers used by the process-level tests."""

from __future__ import annotations

from datetime import datetime

from django_weft.contrib.celery.dispatch import CeleryDispatcher


class DoublingCeleryDispatcher(CeleryDispatcher):
    """Sends every turn and every activity attempt twice: duplicate delivery on purpose."""

    def dispatch_turn(self, run_id: str, *, eta: datetime | None = None) -> None:
        super().dispatch_turn(run_id, eta=eta)
        super().dispatch_turn(run_id, eta=eta)

    def dispatch_activity(
        self, run_id: str, seq: int, attempt: int, *, queue: str, timeout: float | None = None
    ) -> None:
        super().dispatch_activity(run_id, seq, attempt, queue=queue, timeout=timeout)
        super().dispatch_activity(run_id, seq, attempt, queue=queue, timeout=timeout)


class UnconsumedQueueDispatcher:
    """Delivers to a queue nobody consumes: like the Celery dispatcher of a project with
    ``django_weft.contrib.celery`` installed and no Celery worker running. Starts mark
    their runs dispatched, as they do there."""

    delivers = True

    def __init__(self) -> None:
        self.turns: list[str] = []

    def dispatch_turn(self, run_id: str, *, eta: datetime | None = None) -> None:
        self.turns.append(run_id)

    def dispatch_activity(
        self, run_id: str, seq: int, attempt: int, *, queue: str, timeout: float | None = None
    ) -> None:
        return None
