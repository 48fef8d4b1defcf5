"""The schedule admin's actions: pause, unpause, trigger and delete schedules.

They work as the run actions do (:mod:`.actions`): choosing one on the changelist shows a
confirmation page listing the schedules, and which of them will be skipped and why;
nothing changes until it is confirmed. Then each schedule goes through its runtime call
(:func:`~django_weft.runtime.pause_schedule`, ``unpause_schedule``, ``trigger_schedule``,
``delete_schedule``), each in its own transaction, one message says what happened to
each, and every schedule changed gets a ``LogEntry`` in the admin's history.

The same confirmation serves the rows ticked, **every schedule the filter and search
match** (the "apply to all" box; on this short table an unfiltered list may be chosen
too: "pause every schedule" is an operator's move), and the buttons on a schedule's page.

Permissions: ``pause_schedule`` for pause and unpause, ``trigger_schedule`` for trigger
(the REST API's), ``delete_schedule`` for delete; an action is offered only with its
permission, and a POST naming it without the permission is refused with 403.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format

from .. import runtime
from ..engine.errors import ScheduleManaged, ScheduleNotFound
from ..models import Schedule
from ..models.schedules import SCHEDULE_ID_MAX_LENGTH
from ..runtime.schedules import SCHEDULE_ID
from .confirmation import ALL_MATCHING, AS_OF, RETURN_TO, list_query, parse_as_of, return_to
from .schedule_forms import PauseForm, TriggerForm

if TYPE_CHECKING:
    from .schedules import ScheduleAdmin

logger = logging.getLogger("django_weft.admin")

SCHEDULES_SHOWN = 100
"""Schedules listed on a confirmation page; the rest are counted."""
LABELS_SHOWN = 10
"""Schedules named per outcome in a message."""
CONFIRM_TEMPLATE = "admin/django_weft/schedule/confirm_action.html"


@dataclass(frozen=True)
class ScheduleAction:
    """One schedule action as the admin offers it."""

    name: str
    label: str
    """The verb on buttons: "Pause"."""
    done: str
    """The verb in outcome messages: "paused"."""
    explanation: str
    options: type[forms.Form] | None = None
    """The form of the confirmation's options (a note, an overlap), if it has any."""

    def title(self) -> str:
        return f"{self.label} schedules"


PAUSE = ScheduleAction(
    "pause_schedules",
    "Pause",
    "paused",
    "A paused schedule does not fire until it is unpaused: the times that pass meanwhile are "
    "dropped, not counted as missed. The note (optional) replaces each schedule's note and is "
    "shown on the list. Schedules already paused are skipped. A trigger or backfill still works.",
    options=PauseForm,
)
UNPAUSE = ScheduleAction(
    "unpause_schedules",
    "Unpause",
    "unpaused",
    "An unpaused schedule fires again from its spec's next time after now; the times that "
    "passed while it was paused are not made up (a backfill does that). Its pause note is "
    "cleared. Schedules that are not paused are skipped.",
)
TRIGGER = ScheduleAction(
    "trigger_schedules",
    "Trigger",
    "triggered",
    "Each schedule fires now, as if now (to the second) were one of its times, paused or not: "
    "a run starts under the overlap policy, so with its previous run still open a skip policy "
    "records a skip and a buffer policy waits. The fire is recorded in its recent actions; "
    "its next scheduled fire does not move.",
    options=TriggerForm,
)
DELETE = ScheduleAction(
    "delete_schedules",
    "Delete",
    "deleted",
    "A deleted schedule fires no more; the runs it started are kept. Schedules declared in "
    "code are skipped: remove the declaration and run manage.py weft_schedules sync --prune.",
)
ACTIONS_BY_NAME: dict[str, ScheduleAction] = {a.name: a for a in (PAUSE, UNPAUSE, TRIGGER, DELETE)}


def refusal_for(action: ScheduleAction, schedule: Schedule) -> str | None:
    """Why ``action`` skips ``schedule`` as things stand, or ``None``."""
    if action is PAUSE and schedule.paused:
        return "already paused"
    if action is UNPAUSE and not schedule.paused:
        return "not paused"
    if action is DELETE and schedule.managed:
        return f"declared in code (workflow {schedule.workflow_name})"
    return None


# -- the actions ----------------------------------------------------------------------------


@admin.action(description="Pause selected schedules", permissions=["pause"])
def pause_schedules(
    model_admin: ScheduleAdmin, request: HttpRequest, queryset: QuerySet[Schedule]
) -> HttpResponse | None:
    return respond(model_admin, request, queryset, PAUSE)


@admin.action(description="Unpause selected schedules", permissions=["pause"])
def unpause_schedules(
    model_admin: ScheduleAdmin, request: HttpRequest, queryset: QuerySet[Schedule]
) -> HttpResponse | None:
    return respond(model_admin, request, queryset, UNPAUSE)


@admin.action(description="Trigger selected schedules now", permissions=["trigger"])
def trigger_schedules(
    model_admin: ScheduleAdmin, request: HttpRequest, queryset: QuerySet[Schedule]
) -> HttpResponse | None:
    return respond(model_admin, request, queryset, TRIGGER)


@admin.action(description="Delete selected schedules", permissions=["delete"])
def delete_schedules(
    model_admin: ScheduleAdmin, request: HttpRequest, queryset: QuerySet[Schedule]
) -> HttpResponse | None:
    return respond(model_admin, request, queryset, DELETE)


SCHEDULE_ACTIONS = (pause_schedules, unpause_schedules, trigger_schedules, delete_schedules)
"""The ``actions`` of the schedule admin (Django's ``delete_selected`` is replaced by
``delete_schedules``, which goes through the runtime and explains the schedules it skips)."""


@dataclass
class ScheduleOutcome:
    """What an action did, schedule by schedule."""

    changed: list[Schedule] = field(default_factory=list)
    skipped: dict[str, list[str]] = field(default_factory=dict)
    """Schedule ids by the reason they were skipped."""
    failed: list[tuple[str, str]] = field(default_factory=list)
    """``(schedule id, error)`` of the schedules the runtime refused unexpectedly."""
    fires: dict[str, dict[str, Any]] = field(default_factory=dict)
    """A trigger's recorded action per schedule id (its ``outcome``, ``run_id``, ``detail``)."""

    def skip(self, schedule_id: str, reason: str) -> None:
        self.skipped.setdefault(reason, []).append(schedule_id)


def respond(
    model_admin: ScheduleAdmin, request: HttpRequest, queryset: QuerySet[Schedule], action: ScheduleAction
) -> HttpResponse | None:
    """Show the confirmation page, or, once confirmed (``post=yes``), apply the action and
    report. ``None`` sends Django's changelist back to the list it came from."""
    all_matching = request.POST.get(ALL_MATCHING) == "1"
    ids = [] if all_matching else selected_ids(request)
    schedules = queryset if all_matching else model_admin.get_queryset(request).filter(pk__in=ids)
    confirmed = request.POST.get("post") == "yes"
    options = action.options(request.POST if confirmed else None) if action.options is not None else None
    if not confirmed or (options is not None and not options.is_valid()):
        return confirmation(model_admin, request, schedules, ids, action, all_matching, options)
    chosen = options.cleaned_data if options is not None else {}
    if all_matching:
        try:
            as_of = parse_as_of(request.POST.get(AS_OF))
        except ValueError:
            model_admin.message_user(
                request,
                "The confirmation's time stamp is not valid; nothing was changed. Choose the action again.",
                messages.ERROR,
            )
            return None
        if as_of is not None:
            schedules = schedules.filter(created_at__lte=as_of)
    outcome = apply(action, list(schedules.order_by("pk")), chosen)
    if not all_matching:
        found = (
            {schedule.pk for schedule in outcome.changed}
            | {sid for group in outcome.skipped.values() for sid in group}
            | {sid for sid, _ in outcome.failed}
        )
        for missing in ids:
            if missing not in found:
                outcome.skip(missing, "no such schedule")
    log_changes(request, action, outcome, chosen)
    text, level = outcome_message(action, outcome)
    model_admin.message_user(request, text, level)
    back = return_to(request)
    if back and action is DELETE and outcome.changed:
        back = None  # the deleted schedule's page is gone: back to the list
    return HttpResponseRedirect(back) if back else None


def apply(action: ScheduleAction, schedules: Iterable[Schedule], chosen: dict[str, Any]) -> ScheduleOutcome:
    """Each schedule through its runtime call, in its own transaction; a schedule deleted
    or changed meanwhile is skipped, an unexpected error is logged and reported."""
    outcome = ScheduleOutcome()
    call: Callable[[Schedule], Schedule | None] = {
        PAUSE.name: lambda s: runtime.pause_schedule(s.pk, chosen.get("note") or ""),
        UNPAUSE.name: lambda s: runtime.unpause_schedule(s.pk),
        TRIGGER.name: lambda s: _trigger(s, chosen.get("overlap") or None, outcome),
        DELETE.name: lambda s: _delete(s),
    }[action.name]
    for schedule in schedules:
        refusal = refusal_for(action, schedule)
        if refusal is not None:
            outcome.skip(schedule.pk, refusal)
            continue
        try:
            changed = call(schedule)
        except ScheduleNotFound:
            outcome.skip(schedule.pk, "no such schedule (deleted meanwhile)")
        except ScheduleManaged:
            outcome.skip(schedule.pk, f"declared in code (workflow {schedule.workflow_name})")
        except Exception as exc:
            logger.exception("admin: %s schedule %s failed", action.label.lower(), schedule.pk)
            outcome.failed.append((schedule.pk, f"{type(exc).__name__}: {exc}"))
        else:
            outcome.changed.append(changed or schedule)
    return outcome


def _trigger(schedule: Schedule, overlap: str | None, outcome: ScheduleOutcome) -> None:
    outcome.fires[schedule.pk] = runtime.trigger_schedule(schedule.pk, overlap=overlap)


def _delete(schedule: Schedule) -> None:
    runtime.delete_schedule(schedule.pk, refuse_managed=True)


FIRE_WORDS = {
    "started": "started run {workflow_id}",
    "already_started": "its run {workflow_id} existed already",
    "skipped": "skipped ({detail})",
    "buffered": "buffered ({detail})",
    "error": "the start was refused ({detail})",
}


def fire_words(fire: dict[str, Any]) -> str:
    """A trigger's recorded action in words: "started run nightly-2027-01-01T09:00:00Z"."""
    template = FIRE_WORDS.get(str(fire.get("outcome")), "{outcome}")
    return template.format(
        workflow_id=fire.get("workflow_id") or fire.get("run_id") or "",
        detail=_shorten(str(fire.get("detail") or "")),
        outcome=fire.get("outcome"),
    )


def outcome_message(action: ScheduleAction, outcome: ScheduleOutcome) -> tuple[str, int]:
    """The message after an action, and its level: a success when every schedule changed,
    a warning when some were skipped (or a trigger did not start a run), an error when some
    failed."""
    changed = len(outcome.changed)
    parts: list[str] = []
    if outcome.fires:
        shown = "; ".join(
            f"{sid}: {fire_words(fire)}" for sid, fire in list(outcome.fires.items())[:LABELS_SHOWN]
        )
        rest = len(outcome.fires) - LABELS_SHOWN
        parts.append(f"Triggered {_schedules(changed)}: {shown}{f'; and {rest} more' if rest > 0 else ''}.")
    elif changed:
        parts.append(
            f"{action.done.capitalize()} {_schedules(changed)}: {_labels(s.pk for s in outcome.changed)}."
        )
    else:
        parts.append(f"No schedule was {action.done}.")
    if outcome.skipped:
        count = sum(len(group) for group in outcome.skipped.values())
        groups = "; ".join(f"{reason}: {_labels(ids)}" for reason, ids in outcome.skipped.items())
        parts.append(f"Skipped {count}: {groups}.")
    if outcome.failed:
        shown = "; ".join(f"{sid} ({_shorten(error)})" for sid, error in outcome.failed[:LABELS_SHOWN])
        parts.append(f"Failed {len(outcome.failed)}: {shown}. The django_weft.admin log has the details.")
    not_started = any(fire.get("outcome") != "started" for fire in outcome.fires.values())
    errors = outcome.failed or any(fire.get("outcome") == "error" for fire in outcome.fires.values())
    level = (
        messages.ERROR if errors else messages.WARNING if outcome.skipped or not_started else messages.SUCCESS
    )
    return " ".join(parts), level


def _schedules(count: int) -> str:
    return f"{count} schedule" if count == 1 else f"{count} schedules"


def _labels(ids: Iterable[str]) -> str:
    listed = list(ids)
    shown = ", ".join(listed[:LABELS_SHOWN])
    rest = len(listed) - LABELS_SHOWN
    return f"{shown} and {rest} more" if rest > 0 else shown


def _shorten(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def history_message(
    action: ScheduleAction, schedule_id: str, outcome: ScheduleOutcome, chosen: dict[str, Any]
) -> str:
    """The ``LogEntry`` message of one changed schedule."""
    if action is PAUSE and chosen.get("note"):
        return f"Paused (note: {chosen['note']})"
    if action is TRIGGER:
        fire = outcome.fires.get(schedule_id, {})
        forced = f" with overlap {chosen['overlap']}" if chosen.get("overlap") else ""
        return f"Triggered{forced}: {fire_words(fire)}"
    return action.done.capitalize()


def log_changes(
    request: HttpRequest, action: ScheduleAction, outcome: ScheduleOutcome, chosen: dict[str, Any]
) -> None:
    """One admin ``LogEntry`` per changed schedule (a deletion for delete)."""
    flag = DELETION if action is DELETE else CHANGE
    by_message: dict[str, list[Schedule]] = {}
    for schedule in outcome.changed:
        by_message.setdefault(history_message(action, schedule.pk, outcome, chosen), []).append(schedule)
    for message, schedules in by_message.items():
        LogEntry.objects.log_actions(
            user_id=request.user.pk,  # type: ignore[arg-type]  # a staff user, never anonymous
            queryset=schedules,
            action_flag=flag,
            change_message=message,
        )


# -- the confirmation page ------------------------------------------------------------------------


def confirmation(
    model_admin: ScheduleAdmin,
    request: HttpRequest,
    schedules: QuerySet[Schedule],
    ids: list[str],
    action: ScheduleAction,
    all_matching: bool,
    options: forms.Form | None,
) -> HttpResponse | None:
    as_of = timezone.now()
    if all_matching:
        # The confirmed request acts on the schedules created up to now, the ones counted here.
        schedules = schedules.filter(created_at__lte=as_of)
    listed = (
        list(schedules.order_by("pk")[: SCHEDULES_SHOWN + 1])
        if all_matching
        else list(schedules.order_by("pk"))
    )
    count = schedules.count() if all_matching and len(listed) > SCHEDULES_SHOWN else len(listed)
    if not count:
        text = (
            "No schedule matches the current filter; nothing was changed."
            if all_matching
            else "The selected schedules no longer exist; nothing was changed."
        )
        model_admin.message_user(request, text, messages.WARNING)
        return None

    rows = [
        {"schedule": schedule, "state": state_words(schedule), "refusal": refusal_for(action, schedule)}
        for schedule in listed[:SCHEDULES_SHOWN]
    ]
    opts = model_admin.opts
    changelist = reverse(
        f"admin:{opts.app_label}_{opts.model_name}_changelist", current_app=model_admin.admin_site.name
    )
    query = list_query(request)
    back = return_to(request)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"{action.title()}?",
        "opts": opts,
        "app_label": opts.app_label,
        "media": model_admin.media + (options.media if options is not None else forms.Media()),
        "weft_action": action,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "all_matching": all_matching,
        "all_matching_var": ALL_MATCHING,
        "as_of_var": AS_OF,
        "as_of": as_of.isoformat(),
        "return_var": RETURN_TO,
        "return_to": back,
        "count": count,
        "plural": count != 1,
        "missing": len(ids) - count if not all_matching else 0,
        "rows": rows,
        "more": count - len(rows),
        "skipped_shown": sum(1 for row in rows if row["refusal"]),
        "selected_ids": [] if all_matching else [schedule.pk for schedule in listed],
        "filter_words": getattr(request, "weft_filter_words", "") or "every schedule",
        "options_form": options,
        "form_url": f"{changelist}?{query}" if query else changelist,
        "back_url": back or (f"{changelist}?{query}" if query else changelist),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, CONFIRM_TEMPLATE, context)


def state_words(schedule: Schedule) -> str:
    """The schedule's state for the confirmation's list: "next fire 2027-01-01 09:00:00"."""
    if schedule.paused:
        return f"paused ({schedule.note})" if schedule.note else "paused"
    if schedule.next_fire_at is None:
        return "ended"
    return f"next fire {date_format(timezone.localtime(schedule.next_fire_at), 'Y-m-d H:i:s')}"


def selected_ids(request: HttpRequest) -> list[str]:
    """The ticked schedule ids, once each, in order (values that cannot be one are dropped:
    the changelist refuses them first, see ``invalid_selection``)."""
    ids: dict[str, None] = {}
    for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
        if is_schedule_id(value):
            ids[value] = None
    return list(ids)


def is_schedule_id(value: str) -> bool:
    return len(value) <= SCHEDULE_ID_MAX_LENGTH and bool(SCHEDULE_ID.fullmatch(value))


__all__ = [
    "DELETE",
    "PAUSE",
    "SCHEDULE_ACTIONS",
    "TRIGGER",
    "UNPAUSE",
    "ScheduleAction",
    "is_schedule_id",
    "outcome_message",
]
