"""``workflows/``: the registered workflows, their parameters and their runs' counts."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from django.db.models import Count
from rest_framework.request import Request
from rest_framework.response import Response

from ...engine.registry import registry
from .. import serializers as s
from ..filters import visible_runs
from ..schema import document
from .common import WeftAPIView, error_responses


class WorkflowListView(WeftAPIView):
    """The registered workflows, their parameters and how many runs each has per status."""

    weft_action = "workflows"
    read_only_actions = frozenset({"workflows"})

    @document(
        summary="Registered workflows", responses={200: s.WorkflowSerializer(many=True), **error_responses()}
    )
    def get(self, request: Request) -> Response:
        counts: dict[str, dict[str, int]] = {}
        rows = (
            visible_runs(request, may_lag=self.reads_may_lag)
            .order_by()
            .values("workflow_name", "status")
            .annotate(n=Count("pk"))
        )
        for row in rows:
            counts.setdefault(row["workflow_name"], {})[row["status"]] = row["n"]
        workflows = []
        for name, definition in sorted(registry.workflows.items()):
            doc = inspect.getdoc(definition.fn) or ""
            workflows.append(
                {
                    "name": name,
                    "description": doc.strip().splitlines()[0] if doc.strip() else "",
                    "parameters": _parameters(definition.fn),
                    "has_finalizer": definition.finalizer is not None,
                    "counts": {status: counts.get(name, {}).get(status, 0) for status in s.STATUS_CHOICES},
                }
            )
        return Response(s.WorkflowSerializer(workflows, many=True).data)


def _parameters(fn: Callable[..., Any]) -> list[dict[str, Any]]:
    """The workflow function's parameters after ``ctx``."""
    parameters = list(inspect.signature(fn).parameters.values())[1:]
    described = []
    for parameter in parameters:
        entry: dict[str, Any] = {
            "name": parameter.name,
            "kind": parameter.kind.name.lower(),
            "required": parameter.default is inspect.Parameter.empty
            and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD),
            "annotation": _annotation(parameter.annotation),
        }
        if parameter.default is not inspect.Parameter.empty:
            entry["default"] = _json_or_repr(parameter.default)
        described.append(entry)
    return described


def _annotation(annotation: Any) -> str | None:
    if annotation is inspect.Parameter.empty:
        return None
    if isinstance(annotation, str):
        return annotation
    return getattr(annotation, "__name__", None) or repr(annotation)


def _json_or_repr(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value
