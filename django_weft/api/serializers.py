"""The JSON shapes of the REST API: the only place that shapes requests and responses.

Request serializers check types and presence; the runtime checks the rest (payload size,
durations, ids) and raises ``InvalidInput``, which the error envelope reports the same way.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from ..engine.records import RunStatus

STATUS_CHOICES = [status.value for status in RunStatus]
ON_CONFLICT_CHOICES = ["use_existing", "fail", "start_new_if_terminal"]


class DurationField(serializers.JSONField):
    """Seconds (a number) or a duration string such as ``"90s"``, ``"1h30m"``, ``"7d"``."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, bool) or not isinstance(data, int | float | str):
            raise serializers.ValidationError('Give seconds (a number) or a duration string such as "1h30m".')
        return data


# -- runs ------------------------------------------------------------------------------


class RunSerializer(serializers.Serializer):
    """A run: the keys of ``handle.describe()`` plus ``url``."""

    run_id = serializers.UUIDField()
    workflow_id = serializers.CharField()
    workflow = serializers.CharField()
    version = serializers.CharField(allow_blank=True)
    status = serializers.ChoiceField(choices=STATUS_CHOICES)
    args = serializers.JSONField()
    kwargs = serializers.JSONField()
    result = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    failure_category = serializers.CharField(allow_null=True)
    attempt = serializers.IntegerField()
    search_attributes = serializers.JSONField()
    waiting_on = serializers.JSONField(allow_null=True)
    execution_deadline = serializers.DateTimeField(allow_null=True)
    owner_id = serializers.CharField(allow_null=True)
    owner_epoch = serializers.IntegerField()
    lease_expires_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    parent_run_id = serializers.UUIDField(allow_null=True)
    url = serializers.URLField()


class RunPageSerializer(serializers.Serializer):
    results = RunSerializer(many=True)
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)


class StartRunSerializer(serializers.Serializer):
    workflow = serializers.CharField(max_length=200, help_text="A registered workflow name.")
    args = serializers.ListField(child=serializers.JSONField(), required=False, default=list)
    kwargs = serializers.DictField(child=serializers.JSONField(), required=False, default=dict)
    id = serializers.CharField(
        required=False,
        allow_null=True,
        trim_whitespace=False,
        help_text="Business key; makes the start idempotent. Default: the Idempotency-Key header, "
        "else the new run id.",
    )
    on_conflict = serializers.ChoiceField(choices=ON_CONFLICT_CHOICES, required=False, default="use_existing")
    execution_timeout = DurationField(required=False, allow_null=True)
    start_delay = DurationField(required=False, allow_null=True)
    search_attributes = serializers.DictField(child=serializers.JSONField(), required=False, default=dict)


# -- history and results --------------------------------------------------------------


class HistoryEntrySerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    kind = serializers.CharField()
    name = serializers.CharField()
    status = serializers.CharField()
    attempt = serializers.IntegerField()
    args = serializers.JSONField(allow_null=True)
    result = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class HistoryPageSerializer(serializers.Serializer):
    results = HistoryEntrySerializer(many=True)
    next = serializers.URLField(allow_null=True, help_text="The next page (``?after_seq=``), if any.")


class ResultSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=STATUS_CHOICES)
    result = serializers.JSONField(required=False, help_text="Present once the run has completed.")


# -- messages ---------------------------------------------------------------------------


class SignalRequestSerializer(serializers.Serializer):
    name = serializers.CharField()
    payload = serializers.JSONField(required=False, allow_null=True, default=None)
    signal_id = serializers.CharField(
        required=False, allow_null=True, help_text="Idempotency key. Default: the Idempotency-Key header."
    )


class SignalAcceptedSerializer(serializers.Serializer):
    signal_id = serializers.CharField(allow_null=True)
    duplicate = serializers.BooleanField(help_text="True when this signal_id had been accepted before.")
    received_at = serializers.DateTimeField()
    sequence = serializers.IntegerField(help_text="Signals to one run are numbered in arrival order.")


class UpdateRequestSerializer(serializers.Serializer):
    name = serializers.CharField()
    payload = serializers.JSONField(required=False, allow_null=True, default=None)
    update_id = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="Idempotency key. Default: the Idempotency-Key header, else a new id.",
    )
    wait = serializers.FloatField(
        required=False,
        min_value=0,
        help_text="Seconds to wait for the outcome (capped by WEFT_API_MAX_WAIT).",
    )


class UpdateOutcomeSerializer(serializers.Serializer):
    update_id = serializers.CharField()
    status = serializers.CharField(
        help_text='"completed" (the handler returned: result is set) or "accepted" (stored, not yet applied).'
    )
    result = serializers.JSONField(required=False, help_text="The handler's result, once completed.")


class QueryRequestSerializer(serializers.Serializer):
    name = serializers.CharField()
    args = serializers.ListField(child=serializers.JSONField(), required=False, default=list)


class QueryResultSerializer(serializers.Serializer):
    result = serializers.JSONField()


# -- lifecycle --------------------------------------------------------------------------


class CancelRequestSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=2000)


class TransitionSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=STATUS_CHOICES)
    run = RunSerializer()


# -- workflows ---------------------------------------------------------------------------


class ParameterSerializer(serializers.Serializer):
    name = serializers.CharField()
    kind = serializers.ChoiceField(
        choices=["positional_only", "positional_or_keyword", "var_positional", "keyword_only", "var_keyword"]
    )
    required = serializers.BooleanField()
    default = serializers.JSONField(required=False, help_text="Present when the parameter has a default.")
    annotation = serializers.CharField(allow_null=True)


class WorkflowSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField(allow_blank=True)
    parameters = ParameterSerializer(many=True)
    has_finalizer = serializers.BooleanField()
    counts = serializers.DictField(child=serializers.IntegerField(), help_text="Runs per status.")


# -- errors -----------------------------------------------------------------------------


class ErrorBodySerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    details = serializers.JSONField()


class ErrorSerializer(serializers.Serializer):
    """Every non-2xx response of these views."""

    error = ErrorBodySerializer()
