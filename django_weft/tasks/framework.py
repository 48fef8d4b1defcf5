"""Django's task framework, wherever it comes from: ``django.tasks`` (Django 6.0 and
later) or the ``django-tasks`` backport (``django_tasks``, for Django 5.2).

The two have the same API under two module names, and name one exception differently
(``InvalidTask`` and ``InvalidTaskError``); the rest of :mod:`django_weft.tasks` imports
the framework from here only, so there is one code path for both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    # Type-checked against the backport: the same API (django-stubs has no django.tasks).
    from django_tasks import DEFAULT_TASK_QUEUE_NAME, task, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started
else:
    try:
        from django.tasks import DEFAULT_TASK_QUEUE_NAME, task, task_backends
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
        from django.tasks.signals import task_enqueued, task_finished, task_started

        SOURCE = "django.tasks"
    except ImportError:
        try:
            from django_tasks import DEFAULT_TASK_QUEUE_NAME, task, task_backends
            from django_tasks.backends.base import BaseTaskBackend
            from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
            from django_tasks.exceptions import InvalidTaskError as InvalidTask
            from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
            from django_tasks.signals import task_enqueued, task_finished, task_started

            SOURCE = "django_tasks"
        except ImportError as exc:
            raise ImproperlyConfigured(
                "django_weft.tasks needs Django's task framework: Django 6.0 or later has it as "
                "django.tasks; on Django 5.2 install its backport, the django-tasks package "
                "(pip install 'django-weft[tasks]'), and add 'django_tasks' to INSTALLED_APPS"
            ) from exc

SOURCE: str
"""Where the framework was imported from: ``"django.tasks"`` or ``"django_tasks"``."""


def is_task(value: Any) -> bool:
    """Whether ``value`` is a task of the framework (of any backend)."""
    return isinstance(value, Task)


__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "SOURCE",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "is_task",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
