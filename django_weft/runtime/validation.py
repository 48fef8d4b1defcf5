"""Update validators: a callable that raises, a DRF ``Serializer`` class, a pydantic model.

A validator runs in the caller's process before anything durable is written. What it
rejects becomes :class:`~django_weft.UpdateValidationError` with a list of issues, each
``{"field": "address.city", "message": "This field is required."}`` (``field`` is
``None`` for the payload as a whole), the shape the REST API returns with HTTP 400.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError

from ..engine.errors import UpdateValidationError

Issue = dict[str, Any]


def validate_payload(validator: Any, payload: Any, *, what: str) -> None:
    """Raise ``UpdateValidationError`` if ``validator`` rejects ``payload``."""
    if validator is None:
        return
    issues = _issues(validator, payload)
    if issues:
        summary = "; ".join(
            f"{issue['field']}: {issue['message']}" if issue["field"] else issue["message"]
            for issue in issues
        )
        raise UpdateValidationError(f"{what} rejected the payload: {summary}", issues=issues)


def _issues(validator: Any, payload: Any) -> list[Issue]:
    serializer_class = _drf_serializer_class(validator)
    if serializer_class is not None:
        serializer = serializer_class(data=payload)
        return [] if serializer.is_valid() else _flatten(serializer.errors)
    model = _pydantic_model(validator)
    if model is not None:
        from pydantic import ValidationError

        try:
            model.model_validate(payload)
        except ValidationError as exc:
            return [
                {"field": ".".join(str(part) for part in error["loc"]) or None, "message": error["msg"]}
                for error in exc.errors()
            ]
        return []
    try:
        validator(payload)
    except UpdateValidationError as exc:
        return list(getattr(exc, "issues", None) or [{"field": None, "message": exc.message}])
    except DjangoValidationError as exc:
        return _flatten(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)
    except Exception as exc:
        detail = getattr(exc, "detail", None)  # DRF's ValidationError
        if detail is not None and _is_drf_error(exc):
            return _flatten(detail)
        return [{"field": None, "message": str(exc) or type(exc).__name__}]
    return []


def _drf_serializer_class(validator: Any) -> Any:
    try:
        from rest_framework.serializers import BaseSerializer
    except ImportError:
        return None
    return validator if isinstance(validator, type) and issubclass(validator, BaseSerializer) else None


def _pydantic_model(validator: Any) -> Any:
    try:
        from pydantic import BaseModel
    except ImportError:
        return None
    return validator if isinstance(validator, type) and issubclass(validator, BaseModel) else None


def _is_drf_error(exc: Exception) -> bool:
    try:
        from rest_framework.exceptions import ValidationError
    except ImportError:
        return False
    return isinstance(exc, ValidationError)


def _flatten(errors: Any, field: str | None = None) -> list[Issue]:
    """DRF / Django error structures (dicts of lists of messages, nested) as issues."""
    if isinstance(errors, dict):
        issues: list[Issue] = []
        for key, value in errors.items():
            if key in ("non_field_errors", "__all__"):
                issues += _flatten(value, field)
            else:
                issues += _flatten(value, f"{field}.{key}" if field else str(key))
        return issues
    if isinstance(errors, list | tuple):
        issues = []
        for index, item in enumerate(errors):
            nested = isinstance(item, dict | list | tuple)
            issues += _flatten(item, (f"{field}.{index}" if field else str(index)) if nested else field)
        return issues
    return [{"field": field, "message": str(errors)}]
