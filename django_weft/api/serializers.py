"""The JSON shapes of the REST API: the only place that shapes requests and responses.

Request serializers check types and presence; the runtime checks the rest (payload size,
durations, ids) and raises ``InvalidInput``, which the error envelope reports the same way.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..engine.records import RunStatus
from ..engine.schedule_firing import OverlapPolicy

STATUS_CHOICES = [status.value for status in RunStatus]
ON_CONFLICT_CHOICES = ["use_existing", "fail", "start_new_if_terminal"]


class DurationField(serializers.JSONField):
    """Seconds (a number) or a duration string such as ``"90s"``, ``"1h30m"``, ``"7d"``."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, bool) or not isinstance(data, int | float | str):
            raise serializers.ValidationError('Give seconds (a number) or a duration string such as "1h30m".')
        return data


# -- runs ------------------------------------------------------------------------------


class CancelRequestStateSerializer(serializers.Serializer):
    reason = serializers.CharField(allow_null=True)
    requested_at = serializers.DateTimeField()
    seq = serializers.IntegerField(
        allow_null=True, help_text="Where the workflow received it in its history; null while pending."
    )
    from_parent = serializers.BooleanField(
        required=False, help_text="Sent by its parent's request_cancel close policy."
    )


class ResetLinkSerializer(serializers.Serializer):
    run_id = serializers.UUIDField(help_text="The other run.")
    seq = serializers.IntegerField(help_text="The position the history was cut at.")
    reason = serializers.CharField()
    reset_at = serializers.DateTimeField()


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
    cancel_request = CancelRequestStateSerializer(
        allow_null=True, help_text="The latest cancellation request (mode request), or null."
    )
    reset_from = ResetLinkSerializer(
        allow_null=True,
        help_text="The run this one was reset from (it kept that run's entries before seq), or null.",
    )
    reset_to = ResetLinkSerializer(
        allow_null=True, help_text="The run that replaced this one by a reset, or null."
    )
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


class ExportedRunSerializer(serializers.Serializer):
    """The ``run`` of a history export (times as ISO 8601 text, as the file holds them)."""

    run_id = serializers.CharField()
    workflow_id = serializers.CharField()
    workflow = serializers.CharField()
    workflow_version = serializers.CharField(allow_blank=True)
    status = serializers.ChoiceField(choices=STATUS_CHOICES)
    failure_category = serializers.CharField(allow_null=True)
    args = serializers.JSONField()
    kwargs = serializers.JSONField()
    attempt = serializers.IntegerField()
    result = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    search_attributes = serializers.JSONField()
    waiting_on = serializers.JSONField(allow_null=True)
    cancel_request = serializers.JSONField(allow_null=True)
    parent_run_id = serializers.CharField(allow_null=True)
    created_at = serializers.CharField()
    updated_at = serializers.CharField()
    finished_at = serializers.CharField(allow_null=True)


class ExportedStepSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    kind = serializers.CharField()
    name = serializers.CharField()
    status = serializers.CharField()
    attempt = serializers.IntegerField()
    args = serializers.JSONField(allow_null=True)
    result = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    started_at = serializers.CharField(allow_null=True)
    finished_at = serializers.CharField(allow_null=True)


class HistoryExportSerializer(serializers.Serializer):
    """A ``django_weft.history`` document: what ``weft_export_history`` writes and
    ``weft_replay --from-file`` reads (docs/reference/history-format.md)."""

    format = serializers.CharField(help_text='Always "django_weft.history".')
    version = serializers.IntegerField(help_text="The format's version (1).")
    exported_at = serializers.CharField()
    run = ExportedRunSerializer()
    steps = ExportedStepSerializer(many=True, help_text="Every recorded step, in seq order.")


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
    mode = serializers.ChoiceField(
        choices=[("terminate", "terminate"), ("request", "request")],
        required=False,
        default="terminate",
        help_text="terminate (default): cancelled now. request: the workflow receives a "
        "cancellation request at its current or next blocking point and may clean up first.",
    )


class TransitionSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=STATUS_CHOICES)
    run = RunSerializer()


class ResetRequestSerializer(serializers.Serializer):
    to_seq = serializers.IntegerField(
        help_text="The position to continue live from: the new run keeps (replays) the entries before it."
    )
    reason = serializers.CharField(max_length=2000, help_text="Why; stored on both runs.")
    args = serializers.ListField(
        child=serializers.JSONField(), required=False, help_text="New positional input (default: the run's)."
    )
    kwargs = serializers.DictField(
        child=serializers.JSONField(), required=False, help_text="New keyword input (default: the run's)."
    )


class ResetSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=STATUS_CHOICES, help_text="The new run's status.")
    run = RunSerializer(help_text="The new run; Location names it.")
    previous_run = RunSerializer(help_text="The run that was reset (closed if it was active).")


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


# -- schedules ---------------------------------------------------------------------------

OVERLAP_CHOICES = [policy.value for policy in OverlapPolicy]
ACTION_OUTCOMES = ["started", "already_started", "skipped", "buffered", "missed", "error"]


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


class ScheduleOptionsSerializer(StrictSerializer):
    """The options of a schedule a request may set; keys the API does not know are refused."""

    workflow = serializers.CharField(max_length=200, required=False, help_text="A registered workflow name.")
    args = serializers.ListField(child=serializers.JSONField(), required=False)
    kwargs = serializers.DictField(child=serializers.JSONField(), required=False)
    cron = serializers.CharField(
        required=False,
        allow_null=True,
        trim_whitespace=False,
        help_text="5 fields (minute hour day month weekday), 6 with a leading seconds field, or "
        "@yearly, @monthly, @weekly, @daily, @hourly; matched on the wall clock of timezone. "
        "Give cron or every.",
    )
    every = DurationField(required=False, allow_null=True, help_text="An interval (at least 1 s).")
    offset = DurationField(
        required=False, allow_null=True, help_text="Shifts an every= interval from the Unix epoch."
    )
    timezone = serializers.CharField(
        required=False, allow_null=True, help_text="An IANA time zone for cron. Default UTC."
    )
    overlap = serializers.ChoiceField(
        choices=OVERLAP_CHOICES,
        required=False,
        help_text="What a fire does while the schedule's previous run is open. Default skip.",
    )
    catchup_window = DurationField(
        required=False, help_text="Fires missed by up to this much still start. Default 60 s."
    )
    jitter = DurationField(
        required=False, allow_null=True, help_text="Delay each fire by up to this much (deterministic)."
    )
    start_at = AwareDateTimeField(required=False, allow_null=True, help_text="No fire before (inclusive).")
    end_at = AwareDateTimeField(required=False, allow_null=True, help_text="No fire after (inclusive).")
    note = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False, max_length=2000)
    search_attributes = serializers.DictField(
        child=serializers.JSONField(),
        required=False,
        help_text="Given to every run, with weft_schedule_id and weft_scheduled_at.",
    )


class CreateScheduleSerializer(ScheduleOptionsSerializer):
    """A new schedule: its id, the workflow, and cron or every; the rest has defaults."""

    id = serializers.CharField(
        trim_whitespace=False,
        help_text="Letters, digits, - and _, starting with a letter or digit; at most 200 characters.",
    )
    workflow = serializers.CharField(max_length=200, help_text="A registered workflow name.")
    paused = serializers.BooleanField(required=False, help_text="Create it paused. Default false.")


class UpdateScheduleSerializer(ScheduleOptionsSerializer):
    """The options to change; those not given stay. cron replaces every (and offset), every
    replaces cron."""

    unknown_key_hints = {
        "paused": "Pause and unpause with POST schedules/{id}/pause/ and unpause/.",
        "id": "A schedule's id does not change; create another schedule.",
    }


class ScheduleActionSerializer(serializers.Serializer):
    """What one scheduled time did."""

    scheduled_at = serializers.DateTimeField()
    actual_at = serializers.DateTimeField()
    outcome = serializers.ChoiceField(
        choices=ACTION_OUTCOMES,
        help_text="started; already_started (its run existed: a fire is idempotent); skipped or "
        "buffered (overlap); missed (older than the catch-up window); error (the start failed).",
    )
    source = serializers.ChoiceField(choices=["schedule", "buffer", "trigger", "backfill"], required=False)
    run_id = serializers.UUIDField(required=False, help_text="The run started (or found).")
    workflow_id = serializers.CharField(required=False)
    detail = serializers.CharField(required=False)


class RecentActionSerializer(ScheduleActionSerializer):
    run_status = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="The run's status now (as a run's status), with run_id; null once the run is deleted.",
    )


class ScheduleSerializer(serializers.Serializer):
    """A schedule: the fields of ``ScheduleHandle.describe()`` plus ``url``. Durations are seconds."""

    id = serializers.CharField()
    workflow = serializers.CharField()
    args = serializers.JSONField()
    kwargs = serializers.JSONField()
    search_attributes = serializers.JSONField()
    cron = serializers.CharField(allow_null=True)
    every = serializers.FloatField(allow_null=True)
    offset = serializers.FloatField()
    timezone = serializers.CharField()
    start_at = serializers.DateTimeField(allow_null=True)
    end_at = serializers.DateTimeField(allow_null=True)
    jitter = serializers.FloatField()
    spec = serializers.CharField(help_text="The spec in words: cron '0 9 * * *' in Europe/Oslo, every 1h.")
    overlap = serializers.ChoiceField(choices=OVERLAP_CHOICES)
    catchup_window = serializers.FloatField()
    paused = serializers.BooleanField()
    note = serializers.CharField(allow_blank=True)
    managed = serializers.BooleanField(
        help_text="Declared in code: only the note, pausing, triggers and backfills are operators'."
    )
    next_fire_at = serializers.DateTimeField(allow_null=True)
    next_fire_times = serializers.ListField(
        child=serializers.DateTimeField(), help_text="The next 5 (none while paused or ended)."
    )
    recent_actions = RecentActionSerializer(many=True, help_text="Newest first, up to 20.")
    fired = serializers.IntegerField(help_text="Runs started.")
    skipped = serializers.IntegerField(help_text="Fires skipped by the overlap policy.")
    missed = serializers.IntegerField(help_text="Fires older than the catch-up window.")
    last_missed_at = serializers.DateTimeField(allow_null=True)
    buffered = serializers.ListField(
        child=serializers.DateTimeField(), help_text="Scheduled times waiting for the open run."
    )
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    url = serializers.URLField()


class PauseRequestSerializer(StrictSerializer):
    note = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False, max_length=2000)


class TriggerRequestSerializer(StrictSerializer):
    overlap = serializers.ChoiceField(
        choices=OVERLAP_CHOICES, required=False, allow_null=True, help_text="Default: the schedule's."
    )


class BackfillRequestSerializer(StrictSerializer):
    start = AwareDateTimeField(help_text="The first scheduled time to fire (inclusive), with an offset.")
    end = AwareDateTimeField(help_text="The last (inclusive), with an offset.")
    overlap = serializers.ChoiceField(choices=OVERLAP_CHOICES, required=False, default="allow_all")


class BackfillSerializer(serializers.Serializer):
    actions = ScheduleActionSerializer(many=True, help_text="One per scheduled time, oldest first.")


# -- bulk operations ---------------------------------------------------------------------

BULK_ACTIONS = ["cancel", "terminate", "request_cancel", "suspend", "resume", "retry"]
BULK_REASON_ACTIONS = ("cancel", "terminate", "request_cancel")


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
        max_length=2000,
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


# -- errors -----------------------------------------------------------------------------


class ErrorBodySerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    details = serializers.JSONField()


class ErrorSerializer(serializers.Serializer):
    """Every non-2xx response of these views."""

    error = ErrorBodySerializer()
