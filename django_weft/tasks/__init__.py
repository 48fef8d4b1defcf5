"""Django's task framework on durable runs: :class:`WeftTaskBackend` for ``TASKS``, and
the framework's tasks as workflow steps (``ctx.run(send_welcome_email, user_id)``).

Works with ``django.tasks`` (Django 6.0 and later) and with the ``django-tasks``
backport on Django 5.2 (docs/how-to/django-tasks.md). Importing this package needs
one of them.
"""

from __future__ import annotations

from typing import Any

from ..engine.registry import Activity, register_activity_adapter
from . import framework
from .backend import WeftTask, WeftTaskBackend
from .runner import QUEUE_ATTRIBUTE, TASK_ATTRIBUTE, WorkerLost, task_activity


def _as_step(target: Any) -> Activity[..., Any] | None:
    """``ctx.run(task, ...)`` with a task of the framework (of any backend): its function,
    run as a recorded activity on its queue, with its retry policy."""
    return task_activity(target) if framework.is_task(target) else None


register_activity_adapter(_as_step)

__all__ = ["QUEUE_ATTRIBUTE", "TASK_ATTRIBUTE", "WeftTask", "WeftTaskBackend", "WorkerLost"]
