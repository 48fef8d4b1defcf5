"""Who may do what through the REST API (DESIGN §6, Permissions).

The default: an authenticated, active staff user holding the model permission of the
operation on ``WorkflowRun``. ``WEFT_API_PERMISSION_CLASSES`` replaces it.
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from ..conf import weft_settings

#: The ``WorkflowRun`` permission each operation needs (view actions are named as in the viewset).
ACTION_PERMISSIONS: dict[str, str] = {
    "list": "view_workflowrun",
    "retrieve": "view_workflowrun",
    "history": "view_workflowrun",
    "result": "view_workflowrun",
    "update_outcome": "view_workflowrun",
    "query": "view_workflowrun",
    "workflows": "view_workflowrun",
    "metadata": "view_workflowrun",
    "create": "add_workflowrun",
    "signal": "signal_workflowrun",
    "send_update": "update_workflowrun",
    "cancel": "cancel_workflowrun",
    "retry": "cancel_workflowrun",
    "suspend": "suspend_workflowrun",
    "resume": "suspend_workflowrun",
}


class IsStaffWithRunPermission(BasePermission):
    """Authenticated active staff holding ``django_weft.<codename>`` for the view's action.

    An action missing from :data:`ACTION_PERMISSIONS` is refused: a new route has to say
    what it needs."""

    message = "You need staff status and the matching django_weft permission for this operation."

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated and user.is_active and user.is_staff):
            return False
        action = getattr(view, "weft_action", None) or getattr(view, "action", None) or ""
        codename = ACTION_PERMISSIONS.get(str(action))
        return codename is not None and bool(user.has_perm(f"django_weft.{codename}"))


def permission_classes() -> list[type[BasePermission]]:
    """The classes in ``WEFT_API_PERMISSION_CLASSES``, else the default."""
    configured = weft_settings.API_PERMISSION_CLASSES
    if configured is None:
        return [IsStaffWithRunPermission]
    return [import_string(path) for path in configured]
