"""The error envelope of django_weft's REST views: ``{"error": {"code", "message", "details"}}``.

:func:`weft_exception_handler` is used by django_weft's views only (their
``get_exception_handler``), so the project's ``EXCEPTION_HANDLER`` and its other views are
untouched. Every :class:`~django_weft.WeftError` a client can cause maps to a 4xx code;
the database away or busy is a 503 with ``Retry-After`` (``unavailable``), not a 500.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response

from ..engine.errors import (
    BulkJobNotFound,
    ConcurrencyLimited,
    InvalidInput,
    InvalidTransition,
    QueryFailed,
    ScheduleAlreadyExists,
    ScheduleManaged,
    ScheduleNotFound,
    UnknownHandler,
    UpdateFailed,
    UpdateNotFound,
    UpdateValidationError,
    WeftError,
    WorkflowAlreadyExists,
    WorkflowCancelled,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowNotRegistered,
    WorkflowTerminalError,
    WorkflowTimedOut,
)
from ..engine.run_logging import get_logger
from ..runtime.outages import MESSAGE as UNAVAILABLE_MESSAGE
from ..runtime.outages import RETRY_AFTER, database_unavailable

logger = get_logger("django_weft.api")

UNAVAILABLE = "unavailable"
"""The code of a 503: the database is away or busy (``Retry-After`` says when to retry)."""


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


def error_response(code: str, message: str, http_status: int, details: Any = None) -> Response:
    details = _encodable(details) if details is not None else {}
    return Response(
        {"error": {"code": code, "message": _encodable(message), "details": details}}, status=http_status
    )


def _encodable(value: Any) -> Any:
    """The value with every string UTF-8 can encode. A message may echo what a client
    sent (a key, a choice), and JSON allows a lone surrogate (``"\\ud800"``) that no
    UTF-8 response can carry: it is written as the escape instead of failing the render."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode()
        return value
    if isinstance(value, dict):
        return {_encodable(key): _encodable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_encodable(item) for item in value]
    return value


# WeftError subclasses a client can cause, most specific first: (class, HTTP status, code).
_WEFT_ERRORS: list[tuple[type[WeftError], int, str]] = [
    (UpdateValidationError, 400, "validation_failed"),
    (UnknownHandler, 400, "unknown_handler"),
    (WorkflowNotRegistered, 400, "unknown_workflow"),
    (InvalidInput, 400, "invalid"),
    (WorkflowNotFound, 404, "not_found"),
    (UpdateNotFound, 404, "not_found"),
    (ScheduleNotFound, 404, "not_found"),
    (BulkJobNotFound, 404, "not_found"),
    (WorkflowAlreadyExists, 409, "already_exists"),
    (ConcurrencyLimited, 409, "concurrency_limited"),
    (ScheduleAlreadyExists, 409, "already_exists"),
    (ScheduleManaged, 409, "conflict"),
    (WorkflowTerminalError, 409, "conflict"),
    (InvalidTransition, 409, "conflict"),
    (WorkflowFailed, 409, "run_failed"),
    (WorkflowCancelled, 409, "run_cancelled"),
    (WorkflowTimedOut, 409, "run_timed_out"),
    (UpdateFailed, 422, "update_failed"),
    (QueryFailed, 422, "query_failed"),
]

_DRF_CODES: dict[type[exceptions.APIException], str] = {
    exceptions.ParseError: "invalid",
    exceptions.ValidationError: "invalid",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "not_authenticated",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
    PayloadTooLarge: "payload_too_large",
}


def weft_error_details(exc: WeftError) -> dict[str, Any]:
    """What a client can act on, from the error's attributes (never a traceback of ours)."""
    if isinstance(exc, UpdateValidationError):
        return {"issues": list(getattr(exc, "issues", []))}
    if isinstance(exc, UnknownHandler):
        return {"kind": exc.kind, "name": exc.name, "registered": list(exc.registered)}
    if isinstance(exc, WorkflowFailed | UpdateFailed):
        return {
            "type": getattr(exc, "error_type", None),
            "message": getattr(exc, "error_message", None),
            "traceback": getattr(exc, "error_traceback", None),
        }
    if isinstance(exc, WorkflowCancelled):
        return {"reason": getattr(exc, "reason", None)}
    if isinstance(exc, ScheduleManaged):
        return {"schedule_id": exc.schedule_id, "declared": list(exc.declared)}
    if isinstance(exc, ConcurrencyLimited):
        run_id = getattr(exc, "run_id", None)
        return {
            "workflow": getattr(exc, "workflow", None),
            "key": getattr(exc, "key", None),
            "limit": getattr(exc, "limit", None),
            "run_id": str(run_id) if run_id is not None else None,
        }
    field = getattr(exc, "field", None)
    if isinstance(exc, InvalidInput) and isinstance(field, str):
        return {"fields": {field: [exc.message]}}
    details = {}
    for key in ("run_id", "workflow_id", "status", "update_id"):
        value = getattr(exc, key, None)
        if value is not None:
            details[key] = str(value)
    return details


def weft_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler producing the envelope; ``None`` (a 500) for anything else."""
    if database_unavailable(exc):
        # The cause on one line (refused, closed, no such table...): the client's answer
        # names none, and a traceback would say nothing more about a database away.
        logger.error("%s: the database is not answering (503): %s", context.get("request"), exc)
        response = error_response(UNAVAILABLE, UNAVAILABLE_MESSAGE, status.HTTP_503_SERVICE_UNAVAILABLE)
        response["Retry-After"] = str(RETRY_AFTER)
        return response
    if isinstance(exc, WeftError):
        for klass, http_status, code in _WEFT_ERRORS:
            if isinstance(exc, klass):
                return error_response(code, exc.message, http_status, weft_error_details(exc))
        return None
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError({"": list(exc.messages)})
    if not isinstance(exc, exceptions.APIException):
        return None
    code = next((code for klass, code in _DRF_CODES.items() if isinstance(exc, klass)), "error")
    http_status = exc.status_code
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        http_status = status.HTTP_401_UNAUTHORIZED
    if isinstance(exc, exceptions.ValidationError):
        message = "The request is not valid; details lists what to fix."
        details: Any = (
            {"fields": exc.detail} if isinstance(exc.detail, dict) else {"fields": {"": exc.detail}}
        )
    else:
        message = str(exc.detail)
        details = {}
    response = error_response(code, message, http_status, details)
    auth_header = getattr(exc, "auth_header", None)
    if auth_header:
        response["WWW-Authenticate"] = auth_header
    wait = getattr(exc, "wait", None)
    if wait:
        response["Retry-After"] = str(int(wait))
    return response
