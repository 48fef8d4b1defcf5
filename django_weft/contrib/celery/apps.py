from __future__ import annotations

from django.apps import AppConfig


class WeftCeleryConfig(AppConfig):
    name = "django_weft.contrib.celery"
    label = "django_weft_celery"
    verbose_name = "Durable workflows on Celery"

    def ready(self) -> None:
        from . import signals  # noqa: F401  (connects the worker-process hooks)
