"""The JSON shapes of bulk operations on runs and of bulk jobs."""

from __future__ import annotations

import json
import math
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ...runtime.operations import BULK_OPERATIONS, CANCEL_REASON, OPERATIONS
from .fields import StrictSerializer

BULK_ACTIONS = list(BULK_OPERATIONS)
BULK_REASON_ACTIONS = tuple(name for name in BULK_OPERATIONS if OPERATIONS[name].reason is not None)


_FILTER_VALUE = {"oneOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]}


@extend_schema_field(
    {
        "type": "object",
        "minProperties": 1,
        "additionalProperties": {
            "oneOf": [*_FILTER_VALUE["oneOf"], {"type": "array", "items": _FILTER_VALUE}]
        },
        "example": {"status": ["waiting"], "workflow": "orders.fulfil", "search.customer": 7},
    }
)
class BulkFilterField(serializers.JSONField):
    """The filters of ``GET runs/`` as an object: each key a query parameter of the list
    (``status``, ``workflow``, ``search.customer``...), each value a string, a number or
    a boolean (taken as its JSON text, as in a query string), or a list of them for a
    repeated parameter. Read as ``{key: [text, ...]}``."""

    def to_internal_value(self, data: Any) -> dict[str, list[str]]:
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                "Give the list's filters as an object, "
                'e.g. {"status": ["waiting"], "workflow": "orders.fulfil"}.'
            )
        if not data:
            raise serializers.ValidationError(
                "Give at least one filter; to act on every run, name the statuses "
                '(e.g. {"status": ["pending", "running", "waiting", "suspended"]}).'
            )
        spec: dict[str, list[str]] = {}
        issues: dict[str, list[str]] = {}
        for key, value in data.items():
            values = value if isinstance(value, list) else [value]
            texts = [_query_text(item) for item in values]
            if not values or any(text is None for text in texts):
                issues[key] = ["Give a string, number or boolean, or a non-empty list of them."]
            else:
                spec[key] = [text for text in texts if text is not None]
        if issues:
            raise serializers.ValidationError(issues)
        return spec


def _query_text(value: Any) -> str | None:
    """A filter value as query-string text, or ``None`` if it cannot be one."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int | float):
        text = json.dumps(value, allow_nan=False) if math.isfinite(value) else ""
    elif isinstance(value, str):
        text = value
    else:
        return None
    try:
        text.encode()
    except UnicodeEncodeError:
        return None  # a lone surrogate: no query string holds one
    return text if text or isinstance(value, str) else None


class BulkRequestSerializer(StrictSerializer):
    """A lifecycle operation on every run the filter matches; keys it does not know are refused."""

    action = serializers.ChoiceField(
        choices=BULK_ACTIONS,
        help_text=(
            '"cancel" and "terminate" cancel each run now; "request_cancel" sends each a '
            "cancellation request."
        ),
    )
    filter = BulkFilterField(help_text="The filters of GET runs/, as an object (at least one).")
    reason = serializers.CharField(
        required=False,
        allow_null=True,
        allow_blank=True,
        max_length=CANCEL_REASON.max_length,
        help_text="Stored with each cancelled run (cancel, terminate and request_cancel only).",
    )
    dry_run = serializers.BooleanField(
        required=False, default=False, help_text="Only count the matching runs; change nothing."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("reason") and attrs["action"] not in BULK_REASON_ACTIONS:
            raise serializers.ValidationError({"reason": [f"{attrs['action']} takes no reason."]})
        return attrs


class BulkCountSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="Runs matching the filter now, as the list shows them.")


class BulkSkipSerializer(serializers.Serializer):
    reason = serializers.CharField()
    count = serializers.IntegerField()
    run_ids = serializers.ListField(child=serializers.UUIDField(), help_text="The first 100.")


class BulkFailureSerializer(serializers.Serializer):
    run_id = serializers.UUIDField()
    workflow_id = serializers.CharField(allow_blank=True)
    error = serializers.CharField()


class BulkJobSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    action = serializers.ChoiceField(choices=BULK_ACTIONS)
    filter = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField(allow_blank=True)),
        help_text="The filter as query-string values.",
    )
    reason = serializers.CharField(allow_blank=True)
    # A string, not an enum: an enum would collide with the runs' StatusEnum in the schema.
    status = serializers.CharField(
        help_text="pending, running, then completed, or failed (error says why).",
    )
    as_of = serializers.DateTimeField(help_text="Runs created later are left alone.")
    matched = serializers.IntegerField(allow_null=True, help_text="Runs matching when the job was created.")
    done = serializers.IntegerField(help_text="Runs changed.")
    skipped = serializers.IntegerField(help_text="Runs left as they were (see skipped_reasons).")
    failed = serializers.IntegerField(help_text="Runs the operation failed on (see failures).")
    skipped_reasons = BulkSkipSerializer(many=True)
    failures = BulkFailureSerializer(many=True, help_text="The first 100.")
    error = serializers.CharField(allow_blank=True, help_text="Why the job failed as a whole.")
    created_by = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    url = serializers.URLField()


class BulkJobStartedSerializer(serializers.Serializer):
    job = BulkJobSerializer()
    url = serializers.URLField(help_text="The job's progress (GET).")
