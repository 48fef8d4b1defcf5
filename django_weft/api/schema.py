"""The OpenAPI schema of django_weft's REST API and its two viewers, served from local
files (drf-spectacular-sidecar): the pages make no request to another host.

The schema covers django_weft's own routes only, under whatever prefix the project
mounted them, whatever the project's ``SPECTACULAR_SETTINGS``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.urls import reverse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerView,
    _get_sidecar_url,
)
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response

from .. import __version__
from .exceptions import weft_exception_handler

API_PACKAGE = "django_weft.api."


def document(**kwargs: Any) -> Callable[[Any], Any]:
    """``extend_schema`` on a view method, based on drf-spectacular's ``AutoSchema`` whatever
    the project's ``DEFAULT_SCHEMA_CLASS`` is (a reusable app cannot rely on that setting)."""

    def decorator(method: Any) -> Any:
        method.kwargs = {**getattr(method, "kwargs", {}), "schema": AutoSchema}
        return extend_schema(**kwargs)(method)

    return decorator


def only_weft_endpoints(endpoints: list[tuple[Any, ...]], **kwargs: Any) -> list[tuple[Any, ...]]:
    """drf-spectacular preprocessing hook: keep the endpoints of django_weft's views."""
    return [
        endpoint
        for endpoint in endpoints
        if getattr(getattr(endpoint[3], "cls", None), "__module__", "").startswith(API_PACKAGE)
    ]


class _Envelope:
    """Errors of the schema pages in the API's envelope too."""

    def get_exception_handler(self) -> Callable[..., Response | None]:
        return weft_exception_handler


class WeftSchemaView(_Envelope, SpectacularAPIView):
    """``schema/``: OpenAPI 3 of these routes (``?format=json`` for JSON)."""

    permission_classes = [IsAdminUser]
    custom_settings = {
        "TITLE": "django-weft API",
        "DESCRIPTION": "Start, inspect, signal, update, query and operate durable workflow runs.",
        "VERSION": __version__,
        "PREPROCESSING_HOOKS": ["django_weft.api.schema.only_weft_endpoints"],
        "COMPONENT_SPLIT_REQUEST": True,
    }

    @document(exclude=True)
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


def _schema_url(request: Request) -> str:
    namespace = request.resolver_match.namespace if request.resolver_match else ""
    return reverse(f"{namespace}:schema" if namespace else "schema")


class WeftSwaggerView(_Envelope, SpectacularSwaggerView):
    """``schema/swagger/``: Swagger UI from the sidecar's static files."""

    permission_classes = [IsAdminUser]
    title = "django-weft API"

    def _get_schema_url(self, request: Request) -> str:
        return _schema_url(request)

    @document(exclude=True)
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        response = super().get(request, *args, **kwargs)
        response.data.update(
            # validatorUrl: None, or Swagger UI asks an outside validator for a badge.
            settings=json.dumps({"deepLinking": True, "validatorUrl": None}),
        )
        return response

    @staticmethod
    def _swagger_ui_resource(filename: str) -> str:
        return str(_get_sidecar_url(f"swagger-ui-dist/{filename}"))

    @staticmethod
    def _swagger_ui_favicon() -> str:
        return str(_get_sidecar_url("swagger-ui-dist/favicon-32x32.png"))


class WeftRedocView(_Envelope, SpectacularRedocView):
    """``schema/redoc/``: Redoc from the sidecar's static files, without web fonts."""

    permission_classes = [IsAdminUser]
    title = "django-weft API"
    template_name = "django_weft/api/redoc.html"

    def _get_schema_url(self, request: Request) -> str:
        return _schema_url(request)

    @document(exclude=True)
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @staticmethod
    def _redoc_standalone() -> str:
        return str(_get_sidecar_url("redoc/bundles/redoc.standalone.js"))
