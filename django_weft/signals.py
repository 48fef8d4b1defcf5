"""Django signals sent when a run changes state, after the change has committed.

Each is sent with ``sender=WorkflowRun`` and the keyword arguments ``run_id``,
``workflow_id`` and ``workflow_name``; the four that end a run (``run_completed``,
``run_failed``, ``run_cancelled``, ``run_timed_out``) add ``finished_at`` (as stored),
and all but ``run_completed`` add ``error`` (the stored error dict). Receivers run in the process
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
"""A run was started (by the client, the REST API, the admin or a parent workflow)."""
run_completed = Signal()
"""A run returned; its result is stored."""
run_failed = Signal()
"""A run failed (its code raised, an activity failed for good, or replay found
nondeterminism); ``error`` is the stored error."""
run_cancelled = Signal()
"""A run was cancelled, or ended cancelled after a cancellation request; ``error`` says
why."""
run_suspended = Signal()
"""A run was suspended."""
run_resumed = Signal()
"""A suspended run was resumed."""
run_timed_out = Signal()
"""A run passed its execution timeout; ``error`` says so."""

__all__ = [
    "run_cancelled",
    "run_completed",
    "run_failed",
    "run_resumed",
    "run_started",
    "run_suspended",
    "run_timed_out",
]
