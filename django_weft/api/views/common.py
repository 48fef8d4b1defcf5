"""What every REST view shares: the base view, the documented error responses, the
path and query parameters of several routes, and the parsing of a wait and an
idempotency key.

Routes and shapes are docs/reference/rest.md's; errors are the envelope of ``exceptions.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import exceptions
from rest_framework.permissions import BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ...engine.errors import InvalidInput
from ...engine.run_logging import get_logger
from ...runtime.operations import WaitRule
from .. import serializers as s
from ..exceptions import weft_exception_handler
from ..parsers import BoundedJSONParser, body_limit, declared_length, too_large
from ..permissions import permission_classes

logger = get_logger("django_weft.api")

IDEMPOTENCY_HEADER = "Idempotency-Key"

ERRORS = OpenApiResponse(s.ErrorSerializer, description="The error envelope (see `error.code`).")


def error_responses(*codes: int) -> dict[int, OpenApiResponse]:
    # 503: any route may find the database away (``unavailable``).
    return dict.fromkeys((400, 401, 403, 404, 413, *codes, 503), ERRORS)


class WeftAPIView(APIView):
    """What every django_weft view shares: JSON only, a bounded body, the error envelope,
    the configured permissions and a schema that does not depend on the project's
    ``DEFAULT_SCHEMA_CLASS``. ``weft_resource`` (``"runs"`` or ``"schedules"``) says
    which permissions the view's actions need."""

    parser_classes = [BoundedJSONParser]
    renderer_classes = [JSONRenderer]
    schema = AutoSchema()
    weft_action: str | None = None
    weft_resource = "runs"
    read_only_actions: frozenset[str] = frozenset()
    """The actions that only show rows: they read ``WEFT_READ_DATABASE``, and may show them
    as they were a moment ago (docs/explanation/scaling.md, "Read replicas"). Every other
    action, and every action that writes or waits for an outcome, reads the primary."""

    @property
    def reads_may_lag(self) -> bool:
        """Whether this request's action is one of :attr:`read_only_actions`."""
        action = self.weft_action or getattr(self, "action", None)
        return action in self.read_only_actions

    def get_permissions(self) -> list[BasePermission]:
        return [permission() for permission in permission_classes()]

    def get_exception_handler(self) -> Callable[..., Response | None]:
        return weft_exception_handler

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # Before authentication reads anything: a declared length over the limit is
        # refused without waiting for a body that may never come.
        declared = declared_length(request.META)
        if declared is not None and declared > body_limit():
            raise too_large(declared)
        # A method the route does not have is a 405 for everyone, before permissions.
        if getattr(self, request.method.lower(), None) is None:
            raise exceptions.MethodNotAllowed(request.method)
        super().initial(request, *args, **kwargs)


def requested_wait(raw: Any, what: str = "wait") -> float:
    """A ``wait`` in seconds from a client (the catalogue's :class:`WaitRule`), capped by
    ``WEFT_API_MAX_WAIT``; none is 0 (answer at once)."""
    if raw is None or raw == "":
        return 0.0
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        raise exceptions.ValidationError({what: f"A number of seconds; got {raw!r}."}) from None
    try:
        return WaitRule(field=what).at_surface(seconds)
    except InvalidInput as exc:
        raise exceptions.ValidationError({what: exc.message}) from None


def idempotency_key(request: Request, given: Any) -> Any:
    """The body's id if it gives one, else the ``Idempotency-Key`` header, else ``None``."""
    if given not in (None, ""):
        return given
    header = request.headers.get(IDEMPOTENCY_HEADER)
    if not header:
        return None
    # WSGI hands header values over as Latin-1; a client sends UTF-8 (RFC 9110 allows
    # only visible ASCII, but a key is an opaque string): read the bytes as UTF-8.
    try:
        return header.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise exceptions.ValidationError(
            {IDEMPOTENCY_HEADER: "The Idempotency-Key header is not UTF-8 text; send ASCII or UTF-8."}
        ) from None


REF = OpenApiParameter(
    "ref",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    description="A run id, or a workflow id (meaning its latest run).",
)
WAIT = OpenApiParameter(
    "wait",
    OpenApiTypes.NUMBER,
    OpenApiParameter.QUERY,
    required=False,
    description="Seconds to wait for an outcome (long poll), capped by WEFT_API_MAX_WAIT. Default 0.",
)
JOB_ID = OpenApiParameter(
    "job_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The bulk job's id."
)
IDEMPOTENCY = OpenApiParameter(
    IDEMPOTENCY_HEADER,
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=False,
    description="Used as the id (run id, signal_id, update_id) when the body gives none: a retry "
    "after a timeout gets the first outcome.",
)
