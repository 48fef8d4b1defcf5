"""Django signals sent when a run changes state, after the change has committed.

Each is sent with ``sender=WorkflowRun`` and the keyword arguments ``run_id``,
``workflow_id`` and ``workflow_name``; ``run_failed``, ``run_cancelled`` and
``run_timed_out`` add ``error`` (the stored error dict). Receivers run in the process
that made the change (a worker, a web request, the sweep) after its transaction
committed, so they never see a change that was rolled back; an exception in a receiver
is logged and does not undo the change::

    from django.dispatch import receiver
    from django_weft.signals import run_failed

    @receiver(run_failed)
    def page_someone(sender, run_id, workflow_name, error, **kwargs):
        ...
"""

from __future__ import annotations

from django.dispatch import Signal

run_started = Signal()
run_completed = Signal()
run_failed = Signal()
run_cancelled = Signal()
run_suspended = Signal()
run_resumed = Signal()
run_timed_out = Signal()

__all__ = [
    "run_cancelled",
    "run_completed",
    "run_failed",
    "run_resumed",
    "run_started",
    "run_suspended",
    "run_timed_out",
]
