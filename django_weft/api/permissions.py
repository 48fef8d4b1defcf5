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
from ..runtime.operations import OPERATIONS, Operation

#: The catalogue's operation (:mod:`django_weft.runtime.operations`) behind each action of
#: the runs' and workflows' views, whose permissions it needs. ``runs/bulk/`` is checked
#: twice: as ``bulk`` (viewing), then as the operation it applies; ``runs/{ref}/reset/``
#: needs both of reset's permissions (it closes a run and starts one).
RUN_ACTIONS: dict[str, str] = {
    "list": "view",
    "retrieve": "view",
    "history": "view",
    "export": "view",
    "result": "view",
    "update_outcome": "view",
    "query": "query",
    "workflows": "view",
    "metadata": "view",
    "bulk": "view",
    "bulk_job": "view",
    "create": "start",
    "signal": "signal",
    "send_update": "update",
    "cancel": "cancel",
    "retry": "retry",
    "reset": "reset",
    "terminate": "terminate",
    "request_cancel": "request_cancel",
    "suspend": "suspend",
    "resume": "resume",
}

#: The operation behind each action of ``schedules/`` (``ScheduleViewSet``'s actions).
SCHEDULE_ACTIONS: dict[str, str] = {
    "list": "view_schedule",
    "retrieve": "view_schedule",
    "metadata": "view_schedule",
    "create": "create_schedule",
    "partial_update": "change_schedule",
    "destroy": "delete_schedule",
    "pause": "pause",
    "unpause": "unpause",
    "trigger": "trigger",
    "backfill": "backfill",
}

#: The table of each ``weft_resource`` a view declares (``"runs"`` when it declares none).
ACTION_TABLES: dict[str, dict[str, str]] = {
    "runs": RUN_ACTIONS,
    "schedules": SCHEDULE_ACTIONS,
}


def operation_of(view: Any) -> Operation | None:
    """The catalogue's operation behind ``view``'s current action, or ``None`` for an
    action no table names."""
    action = getattr(view, "weft_action", None) or getattr(view, "action", None) or ""
    table = ACTION_TABLES.get(str(getattr(view, "weft_resource", "runs")), {})
    name = table.get(str(action))
    return OPERATIONS[name] if name is not None else None


class IsStaffWithRunPermission(BasePermission):
    """Authenticated active staff holding the permissions of the operation behind the
    view's action, looked up in the table of the view's ``weft_resource``
    (:data:`ACTION_TABLES`): run permissions for runs and workflows, schedule permissions
    for schedules.

    An action missing from its table is refused: a new route has to say what it needs."""

    message = "You need staff status and the matching django_weft permission for this operation."

    def has_permission(self, request: Request, view: Any) -> bool:
        described = operation_of(view)
        return described is not None and described.allowed(request.user)


def permission_classes() -> list[type[BasePermission]]:
    """The classes in ``WEFT_API_PERMISSION_CLASSES``, else the default."""
    configured = weft_settings.API_PERMISSION_CLASSES
    if configured is None:
        return [IsStaffWithRunPermission]
    return [import_string(path) for path in configured]
