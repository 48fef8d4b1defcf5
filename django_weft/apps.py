from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules

from .engine.ports import set_payload_validator, set_starter


def start_workflow(workflow_name: str, /, *, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The engine's ``Starter`` port: ``Workflow.start`` starts a run through the client."""
    from . import client  # loaded on first use, as before the port existed

    return client.start(workflow_name, args=args, kwargs=kwargs)


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

        module = weft_settings.AUTODISCOVER_MODULE
        if module:
            autodiscover_modules(module)
