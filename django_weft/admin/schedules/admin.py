"""The schedules' admin at ``admin/django_weft/schedule/``: the list with each schedule's
spec in words, next fire, last outcome and counters; the actions pause, unpause, trigger
and delete (:mod:`.actions`); the add and change form of a schedule made by hand
(:mod:`.forms`); a schedule's page with its next fire times, recent actions and
runs (:mod:`.display`); and the **Backfill** tool (:mod:`.backfill`).

Reads only: rows are listed through the runtime's schedule queryset, a schedule's state
through :func:`django_weft.runtime.describe_schedules`; every change goes through the
runtime's schedule functions, which check it first and write it (nothing here saves a
row). The list, and a schedule's page to a user who may not change schedules, only show
rows: they read ``WEFT_READ_DATABASE`` (:mod:`..common.reads`); a form that may be saved
reads the primary database.
A schedule declared in code (``managed``) shows its declaration read-only: only its note
can be changed here, and it cannot be deleted from here (the next ``weft_schedules sync``
would put it back); it can be paused, unpaused, triggered and backfilled like any other.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ... import runtime
from ...engine.errors import ScheduleManaged, ScheduleNotFound
from ...models import Schedule, WorkflowRun
from ...runtime.operations import OPERATIONS
from ...runtime.schedules import spec_of
from ..common.display import moment, zoned_moment
from ..common.forms import as_sentence
from ..common.reads import reads_may_lag, show_only
from ..common.selection import RETURN_TO, ConfirmedActionsAdmin
from ..common.urls import admin_url, url_name
from .actions import (
    ACTIONS_BY_NAME,
    PAUSE,
    SCHEDULE_ACTIONS,
    TRIGGER,
    UNPAUSE,
    ScheduleAction,
    is_schedule_id,
)
from .backfill import BackfillView
from .display import (
    OUTCOME_LABELS,
    action_row,
    as_datetime,
    local_and_utc,
    managed_note,
    managed_refusal,
    operator_in_utc,
    outcome_badge,
    run_link,
    schedule_moment,
    schedule_zone,
    time_columns,
)
from .forms import ScheduleForm, seconds_text

NEXT_FIRES_SHOWN = 10

# -- the changelist -------------------------------------------------------------------------------


class ScheduleChangeList(ChangeList):
    """The changelist, with the page's latest actions and their runs' current statuses
    (one query for the page, :func:`~django_weft.runtime.describe_schedules`)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        schedules = list(self.result_list)
        for schedule, described in zip(
            schedules, runtime.describe_schedules(schedules, next_count=0), strict=True
        ):
            schedule.weft_last_action = described.recent_actions[0] if described.recent_actions else None
        self.result_list = schedules


class ScheduleWorkflowFilter(admin.SimpleListFilter):
    """The workflows the schedules start (a short table: DISTINCT is cheap here)."""

    title = "workflow"
    parameter_name = "workflow"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = (
            model_admin.get_queryset(request)
            .order_by("workflow_name")
            .values_list("workflow_name", flat=True)
        )
        return [(name, name) for name in names.distinct()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> QuerySet[Schedule]:
        value = self.value()
        return queryset.filter(workflow_name=value) if value else queryset


class DueFilter(admin.SimpleListFilter):
    """The schedules whose next fire is due (not paused, next fire at or before now): the
    ones the tick has yet to fire (the dashboard links here for a workflow no live worker
    has registered)."""

    title = "due"
    parameter_name = "due"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("now", "due now")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> QuerySet[Schedule]:
        if self.value() != "now":
            return queryset
        return queryset.filter(paused=False, next_fire_at__lte=timezone.now())


class DeclaredInCodeFilter(admin.BooleanFieldListFilter):
    """``managed``, said as the list says it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.title = "declared in code"


class LastOutcomeFilter(admin.SimpleListFilter):
    """What the schedule's latest recorded action was (a fire refused is ``error``)."""

    title = "last outcome"
    parameter_name = "last_outcome"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(OUTCOME_LABELS.items())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> QuerySet[Schedule]:
        value = self.value()
        if value not in OUTCOME_LABELS:
            return queryset
        return queryset.filter(recent_actions__0__outcome=value)


# -- the admin ------------------------------------------------------------------------------------

WORKFLOW_FIELDS = ("workflow", "args", "kwargs", "search_attributes")
SPEC_FIELDS = ("cron", "every", "offset", "timezone", "start_at", "end_at", "jitter")
POLICY_FIELDS = ("overlap", "catchup_window")
STATE_FIELDS = (
    "id",
    "spec_in_words",
    "state",
    "next_fire_times",
    "counters",
    "buffered_fires",
    "runs_of_schedule",
    "created",
    "updated",
)
"""The first section of a schedule's page: what it does and did (read-only)."""
QUERY_FILLS = frozenset(
    {"id", *WORKFLOW_FIELDS, "cron", "every", "offset", "timezone", "jitter", *POLICY_FIELDS, "note"}
)
"""The add form's boxes a link may fill in from the query string."""
DECLARED_FIELDS = (*WORKFLOW_FIELDS, *SPEC_FIELDS, *POLICY_FIELDS)
"""What a declaration in code sets: read-only on a managed schedule's page."""


class ScheduleAdmin(ConfirmedActionsAdmin):
    """Schedules: list, pause, unpause, trigger, create, change, delete and backfill them,
    each through the runtime, behind the schedule permissions."""

    form = ScheduleForm
    list_display = (
        "id",
        "workflow",
        "spec",
        "next_fire",
        "overlap",
        "last_outcome",
        "fired_skipped_missed",
        "in_code",
    )
    list_display_links = ("id",)
    list_filter = (
        "paused",
        ("managed", DeclaredInCodeFilter),
        ScheduleWorkflowFilter,
        DueFilter,
        "overlap",
        LastOutcomeFilter,
    )
    search_fields = ("id", "workflow_name")
    search_help_text = "Part of a schedule id or a workflow name."
    ordering = ("id",)
    sortable_by = ("id", "workflow", "next_fire", "overlap", "in_code")
    list_per_page = 100
    actions = SCHEDULE_ACTIONS
    guarded_actions = frozenset(ACTIONS_BY_NAME)
    # Schedules are few: "apply to all" may take the whole list ("pause every schedule").
    all_matching_needs_filter = False
    change_form_template = "admin/django_weft/schedule/change_form.html"
    add_fieldsets = (
        (None, {"fields": ("id", *WORKFLOW_FIELDS)}),
        ("When", {"fields": SPEC_FIELDS}),
        ("Policies", {"fields": POLICY_FIELDS}),
        ("Note", {"fields": ("note", "paused")}),
    )

    class Media:
        css = {"all": ("django_weft/admin.css", "django_weft/actions.css", "django_weft/tools.css")}

    # -- permissions ------------------------------------------------------------------------

    def has_pause_permission(self, request: HttpRequest) -> bool:
        """Pause and unpause: the catalogue's permissions of these operations."""
        return OPERATIONS["pause"].allowed(request.user) and OPERATIONS["unpause"].allowed(request.user)

    def has_trigger_permission(self, request: HttpRequest) -> bool:
        """Trigger and backfill: the catalogue's permissions of these operations."""
        return OPERATIONS["trigger"].allowed(request.user) and OPERATIONS["backfill"].allowed(request.user)

    def has_delete_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        # A schedule declared in code is deleted by removing its declaration (sync --prune).
        if obj is not None and obj.managed:
            return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 passes where the actions are shown (ActionLocation); 5.2 passes nothing.
        location = {} if action_location is None else {"action_location": action_location}
        actions = super().get_actions(request, **location)
        actions.pop("delete_selected", None)  # delete_schedules goes through the runtime
        return actions

    # -- the list ---------------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        return runtime.schedule_queryset(may_lag=reads_may_lag(request))

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ScheduleChangeList

    def invalid_selection(self, request: HttpRequest, values: list[str]) -> str | None:
        bad = [value for value in values if not is_schedule_id(value)]
        if not bad:
            return None
        return f"Not a schedule id: {', '.join(repr(value[:40]) for value in bad[:5])}; nothing was changed."

    @admin.display(description="spec")
    def spec(self, schedule: Schedule) -> str:
        return spec_of(schedule).describe()

    @admin.display(description="next fire", ordering="next_fire_at")
    def next_fire(self, schedule: Schedule) -> SafeString | str:
        if schedule.paused:
            return format_html('<span class="weft-paused" title="{}">paused</span>', schedule.note or "")
        if schedule.next_fire_at is None:
            return format_html('<span class="quiet">{}</span>', "ended")
        return schedule_moment(schedule, schedule.next_fire_at)

    @admin.display(description="fired / skipped / missed")
    def fired_skipped_missed(self, schedule: Schedule) -> str:
        return f"{schedule.fired_count} / {schedule.skipped_count} / {schedule.missed_count}"

    @admin.display(description="in code", ordering="managed")
    def in_code(self, schedule: Schedule) -> SafeString | str:
        if not schedule.managed:
            return ""
        return format_html('<span title="declared with workflow {}">yes</span>', schedule.workflow_name)

    @admin.display(description="last outcome")
    def last_outcome(self, schedule: Schedule) -> SafeString | str:
        action = getattr(schedule, "weft_last_action", None)
        if action is None:
            if not schedule.recent_actions:
                return "-"
            action = schedule.recent_actions[0]
        # The scheduled time names the run (its workflow id is "<schedule id>-<that time>").
        when = moment(as_datetime(action.get("scheduled_at")))
        badge = outcome_badge(str(action.get("outcome")))
        if action.get("run_id"):
            return format_html("{} {}", badge, run_link(action, label=when))
        detail = str(action.get("detail") or "")
        shown = detail if len(detail) <= 60 else detail[:59] + "…"
        return format_html('{} {} <span class="quiet" title="{}">{}</span>', badge, when, detail, shown)

    # -- the add and change form ---------------------------------------------------------------

    def get_fieldsets(self, request: HttpRequest, obj: Schedule | None = None) -> Any:
        if obj is None:
            return self.add_fieldsets
        workflow: dict[str, Any] = {"fields": WORKFLOW_FIELDS}
        if obj.managed:
            workflow["description"] = managed_note(obj)
        return (
            (None, {"fields": STATE_FIELDS}),
            ("Workflow", workflow),
            ("When", {"fields": SPEC_FIELDS}),
            ("Policies", {"fields": POLICY_FIELDS}),
            ("Note", {"fields": ("note",)}),
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Schedule | None = None) -> Any:
        if obj is None:
            return ()
        if obj.managed:
            return (*STATE_FIELDS, *DECLARED_FIELDS)
        return STATE_FIELDS

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, str | list[str]]:
        """Boxes the query string fills in (``add/?workflow=reports.daily&cron=@daily``):
        the text boxes only (a date box given text would not render)."""
        filled: dict[str, str | list[str]] = {}
        for name in QUERY_FILLS & set(request.GET):
            value = str(request.GET[name])
            if "\x00" not in value and len(value) <= 10_000:
                filled[name] = value
        return filled

    def get_form(
        self, request: HttpRequest, obj: Schedule | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        if obj is not None:
            form.base_fields.pop("paused", None)  # pausing is an action, with its note
        return form

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        """Nothing to write: validating the form applied it through the runtime."""

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """No related rows."""

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if not self.has_change_permission(request):
            # Read-only to this user: the page only shows the schedule. A form that may be
            # saved is read from the primary, so it is not filled with a lagging copy.
            show_only(request)
        return super().change_view(request, object_id, form_url, extra_context)

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Schedule | None:
        if not is_schedule_id(object_id):
            return None  # no schedule has it (and a NUL would upset PostgreSQL)
        return super().get_object(request, object_id, from_field)

    # -- deleting -----------------------------------------------------------------------------

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        schedule = self.get_object(request, unquote(object_id))
        if schedule is not None and schedule.managed and self.has_view_permission(request, schedule):
            self.message_user(request, managed_refusal(schedule), messages.ERROR)
            return HttpResponseRedirect(self.url("change", schedule.pk))
        try:
            return super().delete_view(request, object_id, extra_context)
        except (ScheduleManaged, ScheduleNotFound) as exc:  # changed or deleted meanwhile
            self.message_user(request, as_sentence(exc.message), messages.ERROR)
            return HttpResponseRedirect(self.url("changelist"))

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        runtime.delete_schedule(obj.pk, refuse_managed=True)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for schedule_id in queryset.values_list("pk", flat=True):
            runtime.delete_schedule(schedule_id, refuse_managed=True)

    # -- a schedule's page --------------------------------------------------------------------

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Schedule | None = None,
    ) -> HttpResponse:
        if obj is not None:
            context.update(self.state_context(request, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def state_context(self, request: HttpRequest, schedule: Schedule) -> dict[str, Any]:
        """The recent actions table and the object tools of a schedule's page."""
        described = runtime.describe_schedules([schedule], next_count=0)[0]
        offered = self.get_actions(request)
        buttons: list[ScheduleAction] = []
        if TRIGGER.name in offered:
            buttons.append(TRIGGER)
        if PAUSE.name in offered:
            buttons.append(UNPAUSE if schedule.paused else PAUSE)
        return {
            "weft_recent_actions": [action_row(action) for action in described.recent_actions],
            "weft_buttons": buttons,
            "weft_may_backfill": self.has_trigger_permission(request),
            "weft_changelist_url": self.url("changelist"),
            "weft_return_var": RETURN_TO,
            "weft_show_utc": not operator_in_utc(),
        }

    def url(self, view: str, *args: Any) -> str:
        return admin_url(Schedule, view, *args, site=self.admin_site.name)

    @admin.display(description="spec")
    def spec_in_words(self, schedule: Schedule) -> str:
        return spec_of(schedule).describe()

    @admin.display(description="state")
    def state(self, schedule: Schedule) -> SafeString | str:
        if schedule.paused:
            note = f" ({schedule.note})" if schedule.note else ""
            return format_html('<strong class="weft-paused">paused</strong>{}', note)
        if schedule.next_fire_at is None:
            return "ended: no fire time is left (past its end, or its cron matches no later date)"
        return format_html(
            "active: fires next at {}", zoned_moment(schedule.next_fire_at, schedule_zone(schedule))
        )

    @admin.display(description="next fire times")
    def next_fire_times(self, schedule: Schedule) -> SafeString | str:
        times = runtime.describe_schedules([schedule], next_count=NEXT_FIRES_SHOWN)[0].next_fire_times
        if not times:
            return "none while paused" if schedule.paused else "none"
        columns = time_columns(schedule)
        head = format_html_join("", "<th>{}</th>", ((label,) for label, _ in columns))
        cells = (
            format_html_join(
                "",
                "<td>{}</td>",
                ((date_format(t.astimezone(zone), "Y-m-d H:i:s T"),) for _, zone in columns),
            )
            for t in times
        )
        rows = format_html_join("", "<tr>{}</tr>", ((row,) for row in cells))
        return format_html(
            '<table class="weft-next-fires"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>', head, rows
        )

    @admin.display(description="counters")
    def counters(self, schedule: Schedule) -> SafeString:
        missed = (
            format_html(" (the last at {})", zoned_moment(schedule.last_missed_at))
            if schedule.last_missed_at
            else ""
        )
        return format_html(
            '<span class="weft-counters">fired {} · skipped {} · missed {}{}</span>',
            schedule.fired_count,
            schedule.skipped_count,
            schedule.missed_count,
            missed,
        )

    @admin.display(description="buffered fires")
    def buffered_fires(self, schedule: Schedule) -> SafeString | str:
        if not schedule.buffered:
            return "none"
        items = format_html_join("", "<li>{} ({} UTC)</li>", (local_and_utc(t) for t in schedule.buffered))
        return format_html(
            '<ul class="weft-buffered">{}</ul>'
            '<div class="help">Scheduled times waiting for run {} to finish.</div>',
            items,
            schedule.latest_workflow_id or "-",
        )

    @admin.display(description="runs")
    def runs_of_schedule(self, schedule: Schedule) -> SafeString:
        url = admin_url(WorkflowRun, "changelist", site=self.admin_site.name)
        query = urlencode({"q": f"weft_schedule_id={schedule.pk}"})
        return format_html('<a href="{}?{}" class="weft-schedule-runs">runs of this schedule</a>', url, query)

    @admin.display(description="created")
    def created(self, schedule: Schedule) -> str:
        return zoned_moment(schedule.created_at)

    @admin.display(description="updated")
    def updated(self, schedule: Schedule) -> str:
        return zoned_moment(schedule.updated_at)

    # What the form's boxes hold, shown read-only (a managed schedule, a view-only user).

    @admin.display(description="workflow", ordering="workflow_name")
    def workflow(self, schedule: Schedule) -> str:
        return schedule.workflow_name

    @admin.display(description="every")
    def every(self, schedule: Schedule) -> str:
        return seconds_text(schedule.every_seconds) or "-"

    @admin.display(description="offset")
    def offset(self, schedule: Schedule) -> str:
        return seconds_text(schedule.offset_seconds) or "-"

    @admin.display(description="jitter")
    def jitter(self, schedule: Schedule) -> str:
        return seconds_text(schedule.jitter_seconds) or "-"

    @admin.display(description="catch-up window")
    def catchup_window(self, schedule: Schedule) -> str:
        return seconds_text(schedule.catchup_window_seconds) or "0s"

    # -- the backfill tool ----------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(BackfillView.as_view(model_admin=self))
        return [
            path("<path:object_id>/backfill/", view, name=url_name(Schedule, "backfill")),
            *super().get_urls(),
        ]


__all__ = ["NEXT_FIRES_SHOWN", "ScheduleAdmin"]
