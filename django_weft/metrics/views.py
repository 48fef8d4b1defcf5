"""``/metrics``: prometheus_client's default registry (or, under ``PROMETHEUS_MULTIPROC_DIR``,
every process's values summed) in the text exposition format, behind the REST API's
permissions: ``WEFT_API_PERMISSION_CLASSES`` when set (a DRF view, authenticated as the
API is), else active staff holding ``django_weft.view_workflowrun``."""

from __future__ import annotations

import functools
import os
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

from ..conf import weft_settings
from ..extras import require_extra
from ..runtime.operations import OPERATIONS

require_extra("prometheus", "django_weft.metrics", "prometheus_client")

from prometheus_client import (  # noqa: E402
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)


def exposition() -> bytes:
    """The metrics of this process, or of every process sharing ``PROMETHEUS_MULTIPROC_DIR``."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest(REGISTRY)


def _response() -> HttpResponse:
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The metrics, for whoever may view runs through the REST API: the classes of
    ``WEFT_API_PERMISSION_CLASSES`` when set, else an active staff user holding
    ``django_weft.view_workflowrun``."""
    if weft_settings.API_PERMISSION_CLASSES is not None:
        response: HttpResponse = _drf_view()(request)
        return response
    if not OPERATIONS["view"].allowed(request.user):
        raise PermissionDenied("You need staff status and the permission to view workflow runs.")
    return _response()


@functools.cache
def _drf_view() -> Any:
    """The view under ``WEFT_API_PERMISSION_CLASSES``: DRF authenticates the request as the
    API does (its authentication classes) and applies those permission classes."""
    from rest_framework.views import APIView

    from ..api.permissions import permission_classes

    class MetricsView(APIView):
        weft_action = "list"  # the runs' "view" operation, should a class read it

        def get_permissions(self) -> list[Any]:
            return [permission() for permission in permission_classes()]

        def get(self, request: Any) -> HttpResponse:
            return _response()

    return MetricsView.as_view()
