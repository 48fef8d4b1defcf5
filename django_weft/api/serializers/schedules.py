"""The JSON shapes of schedules and their operations (pause, trigger, backfill)."""

from __future__ import annotations

from rest_framework import serializers

from ...engine.registry import MAX_NAME_LENGTH
from ...runtime.operations import OPERATIONS, SCHEDULE_NOTE
from .fields import AwareDateTimeField, DurationField, StrictSerializer

OVERLAP_CHOICES = list(OPERATIONS["create_schedule"].values("overlap"))
ACTION_OUTCOMES = ["started", "already_started", "skipped", "buffered", "missed", "error"]


class ScheduleOptionsSerializer(StrictSerializer):
    """The options of a schedule a request may set; keys the API does not know are refused."""

    workflow = serializers.CharField(
        max_length=MAX_NAME_LENGTH, required=False, help_text="A registered workflow name."
    )
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
    note = serializers.CharField(
        required=False, allow_blank=True, trim_whitespace=False, max_length=SCHEDULE_NOTE.max_length
    )
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
    workflow = serializers.CharField(max_length=MAX_NAME_LENGTH, help_text="A registered workflow name.")
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
    note = serializers.CharField(
        required=False, allow_blank=True, trim_whitespace=False, max_length=SCHEDULE_NOTE.max_length
    )


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
