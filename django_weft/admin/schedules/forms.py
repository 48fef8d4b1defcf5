"""The schedule admin's forms: add and change a schedule made by hand, and backfill one.

Nothing here writes a row itself. :class:`ScheduleForm` is a ``ModelForm`` only because
the admin's add and change views need one: validating it hands what was typed to the
runtime (:func:`~django_weft.runtime.create_schedule` or
:func:`~django_weft.runtime.update_schedule` with ``refuse_managed``), which checks
everything before it writes anything; a refusal becomes an error on the field at fault
(``InvalidSchedule.field``) and the page is shown again with nothing written. The admin's
view then only logs the change (its ``save_model`` writes nothing).

The form checks what a field can check alone (JSON, durations, control characters, dates
that do not exist in the operator's time zone); the runtime checks the rest: the cron
expression, the time zone, the workflow and its arguments, bounds, a taken id.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from typing import Any, ClassVar
from zoneinfo import available_timezones

from django import forms
from django.contrib.admin import widgets
from django.core.exceptions import ValidationError
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ... import runtime
from ...engine.errors import (
    ScheduleAlreadyExists,
    ScheduleManaged,
    ScheduleNotFound,
    WeftError,
    WorkflowArgumentsError,
    WorkflowNotRegistered,
)
from ...engine.schedule_spec import InvalidSchedule
from ...models import Schedule
from ...models.schedules import SCHEDULE_ID_MAX_LENGTH
from ...runtime.operations import SCHEDULE_NOTE
from ..common.forms import DurationTextField, JSONTextField, TextField, as_sentence, workflow_choices

SPEC_FIELDS = ("cron", "every", "offset", "timezone", "start_at", "end_at", "jitter")
"""The form's fields that make the spec: a change to one sends them all, so the spec
saved is the one on the page."""
WORKFLOW_FIELDS = ("workflow", "args", "kwargs", "search_attributes")
POLICY_FIELDS = ("overlap", "catchup_window")
DEFAULT_CATCHUP_WINDOW = "1m"


def seconds_text(seconds: float | None) -> str:
    """Seconds as the duration text the forms take: ``5400`` is ``"1h30m"``, ``0.5`` is
    ``"0.5s"``; ``""`` for none."""
    if not seconds:
        return ""
    parts: list[str] = []
    rest = float(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= size:
            whole = int(rest // size)
            parts.append(f"{whole}{unit}")
            rest -= whole * size
    if rest or not parts:
        parts.append(f"{round(rest, 6):g}s")
    return "".join(parts)


class TimeZoneInput(widgets.AdminTextInputWidget):
    """A text box offering the IANA time zone names (a ``<datalist>``)."""

    datalist_id = "weft-timezones"

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__({"list": self.datalist_id, "autocomplete": "off", **(attrs or {})})

    def render(
        self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None
    ) -> SafeString:
        box = super().render(name, value, attrs, renderer)
        options = format_html_join(
            "", '<option value="{}">', ((zone,) for zone in sorted(available_timezones()))
        )
        return format_html('{}<datalist id="{}">{}</datalist>', box, self.datalist_id, options)


class AwareDateTimeField(forms.SplitDateTimeField):
    """A date and a time typed in the operator's time zone (Django makes them aware in the
    current time zone and refuses a time that does not exist there or occurs twice)."""

    widget = widgets.AdminSplitDateTime

    def compress(self, data_list: tuple[date, time] | None) -> datetime | None:
        value = super().compress(data_list)
        if value is not None:
            try:
                value.astimezone(UTC)
            except OverflowError:
                raise ValidationError("This time is out of range; give a year between 1 and 9999.") from None
        return value


def note_field() -> forms.CharField:
    return forms.CharField(
        required=False,
        max_length=SCHEDULE_NOTE.max_length,
        widget=widgets.AdminTextareaWidget(attrs={"rows": 2, "cols": 60}),
        help_text="Why this schedule exists or was paused; shown on the list. Pausing replaces it.",
    )


class ScheduleForm(forms.ModelForm):
    """Add or change a schedule made by hand; on a schedule declared in code the admin
    offers only the note (the rest is read-only). Validating the form applies it through
    the runtime: :attr:`applied` is the schedule as written."""

    id = TextField(
        label="Id",
        max_length=SCHEDULE_ID_MAX_LENGTH,
        help_text="Letters, digits, - and _ (such as invoices-eu): the first part of each run's workflow id.",
    )
    workflow = forms.ChoiceField(choices=workflow_choices, help_text="A workflow registered in this process.")
    args = JSONTextField(
        expect=list, empty=[], what="args", help_text='A JSON list of positional arguments, such as ["eu"].'
    )
    kwargs = JSONTextField(
        expect=dict,
        empty={},
        what="kwargs",
        help_text='A JSON object of keyword arguments, such as {"region": "eu"}.',
    )
    search_attributes = JSONTextField(
        expect=dict,
        empty={},
        what="search_attributes",
        help_text='A JSON object stored with each run for searching, such as {"team": "billing"}; '
        "weft_schedule_id and weft_scheduled_at are added.",
    )
    cron = TextField(
        label="Cron",
        required=False,
        widget=widgets.AdminTextInputWidget(attrs={"placeholder": "30 6 * * mon-fri"}),
        help_text="Five fields (minute hour day month weekday), six with a leading seconds field, or "
        "@hourly, @daily, @weekly, @monthly, @yearly; matched against the wall clock of the time zone. "
        "Give this or an interval.",
    )
    every = DurationTextField(
        what="every",
        label="Every",
        help_text='An interval instead of cron, such as "15m" or "1h" (at least 1s); it counts in absolute '
        "time from the Unix epoch.",
    )
    offset = DurationTextField(
        what="offset",
        label="Offset",
        help_text='With an interval: fire this much later, such as "5m" (00:05, 01:05...).',
    )
    timezone = TextField(
        label="Time zone",
        max_length=64,
        initial="UTC",
        widget=TimeZoneInput(),
        help_text="An IANA name such as Europe/Oslo, for cron expressions.",
    )
    start_at = AwareDateTimeField(
        label="Start at", required=False, help_text="Optional: no fire before this time (your time zone)."
    )
    end_at = AwareDateTimeField(
        label="End at", required=False, help_text="Optional: no fire after this time (your time zone)."
    )
    jitter = DurationTextField(
        what="jitter", label="Jitter", help_text='Optional: delay each run by up to this much, such as "30s".'
    )
    overlap = forms.ChoiceField(
        choices=Schedule.Overlap.choices,
        initial=Schedule.Overlap.SKIP,
        help_text="What a fire does while the schedule's previous run is still open.",
    )
    catchup_window = DurationTextField(
        what="catchup_window",
        label="Catch-up window",
        initial=DEFAULT_CATCHUP_WINDOW,
        help_text="Fires missed while nothing ticked start late if no older than this; older ones are "
        "counted as missed. Empty for 1m.",
    )
    note = note_field()
    paused = forms.BooleanField(
        label="Create paused", required=False, help_text="It fires only once unpaused (or when triggered)."
    )

    class Meta:
        model = Schedule
        fields: ClassVar[list[str]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.applied: Schedule | None = None
        existing = self.instance if not self.instance._state.adding else None
        if existing is not None:
            for name, value in initial_of(existing).items():
                self.initial.setdefault(name, value)
        if "workflow" in self.fields:
            field = self.fields["workflow"]
            assert isinstance(field, forms.ChoiceField)
            choices = list(workflow_choices())
            current = self.initial.get("workflow")
            if current and current not in {value for value, _ in choices}:
                choices.append((current, f"{current} (not registered in this process)"))
            field.choices = choices

    @property
    def adding(self) -> bool:
        return bool(self.instance._state.adding)

    def _post_clean(self) -> None:
        # No construct_instance() and no model validation: the runtime checks a schedule
        # and writes it, or refuses it with the field at fault.
        if self.errors:  # the boxes' own errors first (full_clean has set them by now)
            return
        try:
            self.applied = self.apply()
        except InvalidSchedule as exc:
            self.refuse(exc, exc.field)
        except WorkflowNotRegistered as exc:
            self.refuse(exc, "workflow")
        except WorkflowArgumentsError as exc:
            # The message names both args and kwargs, next to each other on the form.
            self.refuse(exc, "args")
        except ScheduleAlreadyExists as exc:
            self.refuse(exc, "id")
        except ScheduleNotFound:
            self.add_error(None, "This schedule no longer exists (deleted meanwhile); nothing was saved.")
        except ScheduleManaged as exc:
            self.refuse(exc, None)
        except WeftError as exc:
            self.refuse(exc, None)
        else:
            self.instance = self.applied

    def refuse(self, exc: WeftError, field: str | None) -> None:
        """The runtime's refusal on the form: on ``field`` if the form shows it."""
        self.add_error(field if field in self.fields else None, as_sentence(exc.message))

    def apply(self) -> Schedule:
        """Create or change the schedule through the runtime (it writes, or raises)."""
        data = self.cleaned_data
        if self.adding:
            return runtime.create_schedule(
                data["id"],
                data["workflow"],
                **{name: data[name] for name in ("args", "kwargs", "search_attributes")},
                **spec_options(data),
                overlap=data["overlap"],
                catchup_window=data["catchup_window"] or DEFAULT_CATCHUP_WINDOW,
                paused=bool(data.get("paused")),
                note=data.get("note") or "",
            )
        schedule_id = self.instance.pk
        changes = self.changes()
        if not changes:
            return self.instance  # nothing to write
        return runtime.update_schedule(schedule_id, refuse_managed=True, **changes)

    def changes(self) -> dict[str, Any]:
        """What changed, as :func:`~django_weft.runtime.update_schedule` options."""
        changed = set(self.changed_data) & set(self.fields)
        data = self.cleaned_data
        options: dict[str, Any] = {}
        if changed & set(SPEC_FIELDS):
            options.update(spec_options(data))
        for name in (*WORKFLOW_FIELDS, "overlap", "note"):
            if name in changed:
                options[name] = data[name]
        if "catchup_window" in changed:
            options["catchup_window"] = data["catchup_window"] or DEFAULT_CATCHUP_WINDOW
        return options


def spec_options(data: dict[str, Any]) -> dict[str, Any]:
    """The spec fields as the runtime's options (empty boxes are ``None``)."""
    return {
        "cron": data["cron"] or None,
        "every": data["every"] or None,
        "offset": data["offset"] or None,
        "timezone": data["timezone"],
        "start_at": data["start_at"],
        "end_at": data["end_at"],
        "jitter": data["jitter"] or None,
    }


def initial_of(schedule: Schedule) -> dict[str, Any]:
    """The form's boxes for a stored schedule (durations as text)."""
    return {
        "id": schedule.pk,
        "workflow": schedule.workflow_name,
        "args": schedule.args,
        "kwargs": schedule.kwargs,
        "search_attributes": schedule.search_attributes,
        "cron": schedule.cron,
        "every": seconds_text(schedule.every_seconds),
        "offset": seconds_text(schedule.offset_seconds),
        "timezone": schedule.timezone,
        "start_at": schedule.start_at,
        "end_at": schedule.end_at,
        "jitter": seconds_text(schedule.jitter_seconds),
        "overlap": schedule.overlap,
        "catchup_window": seconds_text(schedule.catchup_window_seconds) or "0s",
        "note": schedule.note,
    }


# -- the actions' options and the backfill tool --------------------------------------------------


class PauseForm(forms.Form):
    """The optional note on the pause confirmation (it replaces each schedule's note)."""

    note = forms.CharField(
        required=False,
        max_length=SCHEDULE_NOTE.max_length,
        strip=True,
        widget=forms.TextInput(attrs={"size": 60, "placeholder": "why these schedules are paused"}),
    )


class TriggerForm(forms.Form):
    """The trigger confirmation's overlap: each schedule's own policy, or one for this fire."""

    overlap = forms.ChoiceField(
        required=False,
        choices=[("", "each schedule's own policy"), *Schedule.Overlap.choices],
        help_text="allow all starts a run even while the schedule's previous run is open.",
    )


class BackfillForm(forms.Form):
    """A range of scheduled times to fire now, in the operator's time zone."""

    start = AwareDateTimeField(help_text="The first scheduled time to fire (inclusive), in your time zone.")
    end = AwareDateTimeField(help_text="The last scheduled time to fire (inclusive), in your time zone.")
    overlap = forms.ChoiceField(
        choices=Schedule.Overlap.choices,
        initial=Schedule.Overlap.ALLOW_ALL,
        help_text="Between the backfilled fires; allow all starts each one whatever is still open.",
    )
