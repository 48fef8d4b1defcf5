"""The fields and base serializers every part of the REST API shapes JSON with, and the
error envelope."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime
from rest_framework import serializers

from ...engine.errors import InvalidInput
from ...engine.records import RunStatus
from ...runtime.operations import WholeNumberRule

STATUS_CHOICES = [status.value for status in RunStatus]


class DurationField(serializers.JSONField):
    """Seconds (a number) or a duration string such as ``"90s"``, ``"1h30m"``, ``"7d"``."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, bool) or not isinstance(data, int | float | str):
            raise serializers.ValidationError('Give seconds (a number) or a duration string such as "1h30m".')
        return data


class RuleField(serializers.IntegerField):
    """A whole number the operations catalogue's rule checks (a start's ``priority``): the
    schema shows the rule's range, and a value is accepted or refused, with the rule's
    message, exactly as the runtime would (no numeric strings, no floats, no booleans)."""

    def __init__(self, rule: WholeNumberRule, **kwargs: Any) -> None:
        self.rule = rule
        super().__init__(min_value=rule.minimum, max_value=rule.maximum, **kwargs)

    def to_internal_value(self, data: Any) -> int:
        try:
            return self.rule.check(data)
        except InvalidInput as exc:
            raise serializers.ValidationError(exc.message) from None


class AwareDateTimeField(serializers.DateTimeField):
    """An ISO 8601 date-time with a time zone offset (``Z`` or ``+01:00``), as UTC. A
    time without an offset is refused rather than read in the server's time zone."""

    def to_internal_value(self, value: Any) -> datetime:
        if not isinstance(value, str):
            raise serializers.ValidationError("Give an ISO 8601 date-time such as 2027-01-01T09:00:00Z.")
        try:
            parsed = parse_datetime(value)
        except ValueError:
            parsed = None
        if parsed is None:
            raise serializers.ValidationError(
                f"Not an ISO 8601 date-time: {value!r}; give one such as 2027-01-01T09:00:00Z."
            )
        if parsed.tzinfo is None or parsed.utcoffset() is None:
            raise serializers.ValidationError(
                f"{value!r} has no time zone; add Z (UTC) or an offset such as +01:00."
            )
        try:
            return parsed.astimezone(UTC)
        except (OverflowError, ValueError):
            raise serializers.ValidationError("This date-time is out of range.") from None


class StrictSerializer(serializers.Serializer):
    """A request body that refuses keys it does not know: a misspelt option is an error,
    not an option silently left at its default."""

    unknown_key_hints: dict[str, str] = {}

    def to_internal_value(self, data: Any) -> Any:
        unknown: dict[str, list[str]] = {}
        if isinstance(data, Mapping):
            keys = ", ".join(self.fields)
            hint = f"Unknown key; the keys are {keys}."
            unknown = {
                str(key): [self.unknown_key_hints.get(str(key), hint)]
                for key in data
                if key not in self.fields
            }
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if unknown and isinstance(exc.detail, dict):
                raise serializers.ValidationError({**exc.detail, **unknown}) from None
            raise
        if unknown:
            raise serializers.ValidationError(unknown)
        return value


class ErrorBodySerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    details = serializers.JSONField()


class ErrorSerializer(serializers.Serializer):
    """Every non-2xx response of these views."""

    error = ErrorBodySerializer()
