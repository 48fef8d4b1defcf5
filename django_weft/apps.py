from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class WeftConfig(AppConfig):
    name = "django_weft"
    verbose_name = "Workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks
        from .conf import weft_settings

        module = weft_settings.AUTODISCOVER_MODULE
        if module:
            autodiscover_modules(module)
