"""Who may do what through the REST API (docs/reference/rest.md, Permissions).

The default: an authenticated, active staff user holding the model permission of the
operation, on ``WorkflowRun`` for runs and workflows, on ``Schedule`` for schedules.
``WEFT_API_PERMISSION_CLASSES`` replaces it.
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from ..conf import weft_settings

#: The ``WorkflowRun`` permission each operation needs (view actions are named as in the viewset).
#: ``runs/bulk/`` is checked twice: as ``bulk``, then under the name of the action it applies;
#: ``runs/{ref}/reset/`` too: as ``reset`` (``cancel_workflowrun``), then as ``create``
#: (``add_workflowrun``): it closes a run and starts one.
ACTION_PERMISSIONS: dict[str, str] = {
    "list": "view_workflowrun",
    "retrieve": "view_workflowrun",
    "history": "view_workflowrun",
    "export": "view_workflowrun",
    "result": "view_workflowrun",
    "update_outcome": "view_workflowrun",
    "query": "view_workflowrun",
    "workflows": "view_workflowrun",
    "metadata": "view_workflowrun",
    "bulk": "view_workflowrun",
    "bulk_job": "view_workflowrun",
    "create": "add_workflowrun",
    "signal": "signal_workflowrun",
    "send_update": "update_workflowrun",
    "cancel": "cancel_workflowrun",
    "retry": "cancel_workflowrun",
    "reset": "cancel_workflowrun",
    "terminate": "cancel_workflowrun",
    "request_cancel": "cancel_workflowrun",
    "suspend": "suspend_workflowrun",
    "resume": "suspend_workflowrun",
}

#: The ``Schedule`` permission each operation of ``schedules/`` needs (``ScheduleViewSet``'s actions).
SCHEDULE_ACTION_PERMISSIONS: dict[str, str] = {
    "list": "view_schedule",
    "retrieve": "view_schedule",
    "metadata": "view_schedule",
    "create": "add_schedule",
    "partial_update": "change_schedule",
    "destroy": "delete_schedule",
    "pause": "pause_schedule",
    "unpause": "pause_schedule",
    "trigger": "trigger_schedule",
    "backfill": "trigger_schedule",
}

#: The table of each ``weft_resource`` a view declares (``"runs"`` when it declares none).
PERMISSION_TABLES: dict[str, dict[str, str]] = {
    "runs": ACTION_PERMISSIONS,
    "schedules": SCHEDULE_ACTION_PERMISSIONS,
}


class IsStaffWithRunPermission(BasePermission):
    """Authenticated active staff holding ``django_weft.<codename>`` for the view's action,
    looked up in the table of the view's ``weft_resource`` (:data:`PERMISSION_TABLES`):
    run permissions for runs and workflows, schedule permissions for schedules.

    An action missing from its table is refused: a new route has to say what it needs."""

    message = "You need staff status and the matching django_weft permission for this operation."

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated and user.is_active and user.is_staff):
            return False
        action = getattr(view, "weft_action", None) or getattr(view, "action", None) or ""
        table = PERMISSION_TABLES.get(str(getattr(view, "weft_resource", "runs")), {})
        codename = table.get(str(action))
        return codename is not None and bool(user.has_perm(f"django_weft.{codename}"))


def permission_classes() -> list[type[BasePermission]]:
    """The classes in ``WEFT_API_PERMISSION_CLASSES``, else the default."""
    configured = weft_settings.API_PERMISSION_CLASSES
    if configured is None:
        return [IsStaffWithRunPermission]
    return [import_string(path) for path in configured]
