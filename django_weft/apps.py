from __future__ import annotations

import contextlib
from collections.abc import Coroutine
from typing import Any

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules

from .engine.ports import set_coroutine_runner, set_payload_validator, set_starter


def start_workflow(workflow_name: str, /, *, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The engine's ``Starter`` port: ``Workflow.start`` starts a run through the client."""
    from . import client  # loaded on first use, as before the port existed

    return client.start(workflow_name, args=args, kwargs=kwargs)


def run_coroutine(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """The engine's ``CoroutineRunner``: an async activity's coroutine on a new event loop
    (asgiref's ``async_to_sync``, which runs it in a thread of its own) while this thread,
    the one running the attempt, serves the coroutine's thread-sensitive calls. So Django's
    async ORM (``await Model.objects.acreate(...)``, ``sync_to_async``) runs here, on this
    thread's connection, which the worker checks and closes as it does a sync activity's,
    not on asgiref's one thread shared by the whole process."""
    from asgiref.sync import async_to_sync

    async def awaited() -> Any:
        return await coroutine

    # A new loop even when this thread serves an outer one (sync code called from async
    # code): the activity's tasks end with it.
    return async_to_sync(awaited, force_new_loop=True)()


class WeftConfig(AppConfig):
    name = "django_weft"
    verbose_name = "Workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks
        from .conf import weft_settings
        from .runtime.validation import validate_payload

        set_starter(start_workflow)
        set_payload_validator(validate_payload)
        set_coroutine_runner(run_coroutine)
        if weft_settings.METRICS:
            from . import metrics

            # Without prometheus_client, the system check django_weft.E027 says so.
            with contextlib.suppress(ImproperlyConfigured):
                metrics.enable()

        if weft_settings.TRACING:
            # Without the OpenTelemetry API, the system check django_weft.E029 says so.
            with contextlib.suppress(ImproperlyConfigured):
                from . import tracing

                tracing.install()

        module = weft_settings.AUTODISCOVER_MODULE
        if module:
            autodiscover_modules(module)
        try:
            from . import tasks  # noqa: F401 - ctx.run takes the framework's tasks
        except ImproperlyConfigured:
            pass  # no task framework (Django 5.2 without the django-tasks backport)
        else:
            if uses_weft_tasks():
                # A worker learns the tasks it can run by importing them.
                autodiscover_modules("tasks")


TASK_BACKENDS = ("django_weft.tasks.WeftTaskBackend", "django_weft.tasks.backend.WeftTaskBackend")
"""How ``TASKS`` may name the backend."""


def uses_weft_tasks() -> bool:
    """Whether ``TASKS`` names :class:`~django_weft.tasks.WeftTaskBackend` (then the task
    framework is installed, or the backend's first use says it is missing)."""
    from django.conf import settings

    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, dict):
        return False
    return any(
        isinstance(params, dict) and params.get("BACKEND") in TASK_BACKENDS for params in configured.values()
    )
