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
