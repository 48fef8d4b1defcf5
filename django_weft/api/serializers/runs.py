"""The JSON shapes of runs: a run, its history and export, messages, lifecycle operations
and workflows. Limits and choices come from the operations catalogue
(:mod:`django_weft.runtime.operations`), so they are the runtime's own."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ...engine.registry import MAX_NAME_LENGTH
from ...models import WorkflowRun
from ...runtime.operations import CANCEL_REASON, OPERATIONS, RESET_REASON, START_PRIORITY
from .fields import STATUS_CHOICES, DurationField, RuleField

ON_CONFLICT_CHOICES = list(OPERATIONS["start"].values("on_conflict"))
CANCEL_MODE_CHOICES = [(choice.value, choice.value) for choice in OPERATIONS["cancel"].choices["mode"]]
SLOT_CHOICES = [str(slot) for slot in WorkflowRun.Slot.values]


@extend_schema_field({"type": "string", "enum": SLOT_CHOICES})
class SlotField(serializers.CharField):
    """A run's concurrency slot: one of :data:`SLOT_CHOICES`, ``""`` (none) included."""


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
    priority = serializers.IntegerField(
        help_text=f"Its start's priority, {START_PRIORITY.minimum} to {START_PRIORITY.maximum}: higher "
        "runs first (among the runs waiting for a worker or a concurrency slot)."
    )
    concurrency_key = serializers.CharField(
        allow_null=True,
        allow_blank=True,
        help_text='The key its workflow\'s concurrency limit counts it by; "" for one limit for the '
        "whole workflow, null when its workflow has no limit.",
    )
    slot = SlotField(
        allow_blank=True,
        help_text='"held": it holds a concurrency slot; "queued": it waits for one (status pending, '
        'waiting_on says why); "": neither (no limit, none taken yet as a delayed start before '
        "it is due, or finished).",
    )
    url = serializers.URLField()


class RunPageSerializer(serializers.Serializer):
    results = RunSerializer(many=True)
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)


class StartRunSerializer(serializers.Serializer):
    workflow = serializers.CharField(max_length=MAX_NAME_LENGTH, help_text="A registered workflow name.")
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
    priority = RuleField(
        START_PRIORITY,
        required=False,
        default=START_PRIORITY.default,
        help_text=f"{START_PRIORITY.minimum} to {START_PRIORITY.maximum}, higher first (default "
        f"{START_PRIORITY.default}): orders the run among those waiting for a worker or for a "
        "concurrency slot.",
    )


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
    failed_attempts = serializers.JSONField(
        allow_null=True,
        help_text="An activity's attempts that failed and were retried, oldest first "
        "(attempt, error, started_at, finished_at); the fields above are its last attempt.",
    )


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


class ExportedStepSerializer(HistoryEntrySerializer):
    """A history entry as the export file holds it: the times as ISO 8601 text."""

    started_at = serializers.CharField(allow_null=True)
    finished_at = serializers.CharField(allow_null=True)
    failed_attempts = None  # not in the history format: a replay does not need them


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
    reason = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, max_length=CANCEL_REASON.max_length
    )
    mode = serializers.ChoiceField(
        choices=CANCEL_MODE_CHOICES,
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
    reason = serializers.CharField(max_length=RESET_REASON.max_length, help_text="Why; stored on both runs.")
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
