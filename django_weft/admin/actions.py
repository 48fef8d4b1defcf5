"""The run admin's lifecycle actions: cancel, suspend, resume and retry runs.

Each action works like Django's ``delete_selected``: choosing it on the changelist shows a
confirmation page listing the runs; confirming applies the operation through
:func:`django_weft.runtime.apply_bulk` (each run in its own transaction), reports the
outcome per run with ``message_user`` and records each changed run in the admin's
``LogEntry`` history. The same page serves:

- the rows ticked on the changelist (``_selected_action``);
- **every run the current filter and search match** (the "apply to all" box next to the
  action menu): the confirmation shows their count and the filter in words, carries the
  changelist's query string, and the confirmed request rebuilds the same queryset with
  the same :class:`~django.contrib.admin.views.main.ChangeList` (so the same filters and
  search apply) and hands it to the runtime, which reads it in batches;
- the lifecycle buttons on a run's page, which post one run to the changelist.

An action is offered only to users with its permission (``cancel_workflowrun`` for cancel
and retry, ``suspend_workflowrun`` for suspend and resume, as in the REST API); a POST
naming one of these actions from anyone else is refused with 403 and changes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from .. import runtime
from ..conf import weft_settings
from ..models import WorkflowRun
from .confirmation import (
    ALL_MATCHING,
    AS_OF,
    RETURN_TO,
    ConfirmedActionsAdmin,
    describe_filters,
    list_query,
    parse_as_of,
    return_to,
)

RUNS_SHOWN = 100
"""Runs listed on a confirmation page; the rest are counted."""
LABELS_SHOWN = 10
"""Runs named per skip reason (or among failures) in an outcome message."""
CONFIRM_TEMPLATE = "admin/django_weft/workflowrun/confirm_action.html"


@dataclass(frozen=True)
class RunAction:
    """One lifecycle action as the admin offers it."""

    name: str
    """The admin action's name (the ``action`` POSTed)."""
    operation: str
    """The :func:`~django_weft.runtime.apply_bulk` operation."""
    label: str
    """The verb on buttons: "Cancel"."""
    done: str
    """The verb in outcome messages and the admin history: "cancelled"."""
    explanation: str
    """What the operation does and which runs it skips, for the confirmation page."""
    takes_reason: bool = False

    def title(self) -> str:
        return f"{self.label} workflow runs"

    def history_message(self, reason: str | None) -> str:
        """The ``LogEntry`` change message of a run this action changed."""
        text = self.done.capitalize()
        return f"{text} (reason: {reason})" if reason else text


CANCEL = RunAction(
    "cancel_runs",
    "cancel",
    "Cancel",
    "cancelled",
    "Cancel now: a cancelled run stops at once and for good: its pending timers are removed, "
    "its pending updates fail, its children are handled by their parent-close policy and its "
    "finalizer runs. Request cancellation instead to let the workflow clean up: it receives the "
    "request at its current or next blocking point (waking from a sleep or a wait), may run "
    "durable clean-up steps, and then finishes cancelled (or carries on, if its code says so). "
    "Finished runs are skipped.",
    takes_reason=True,
)
REQUEST_CANCEL = RunAction(
    "cancel_runs",
    "request_cancel",
    "Request cancellation of",
    "asked to cancel",
    "",
    takes_reason=True,
)
"""The cancel action confirmed with "request cancellation": its operation and messages."""
CANCEL_MODES = (
    ("terminate", "Cancel now"),
    ("request", "Request cancellation (the workflow can clean up)"),
)
SUSPEND = RunAction(
    "suspend_runs",
    "suspend",
    "Suspend",
    "suspended",
    "No worker drives a suspended run until it is resumed; it keeps its history and timers, "
    "and signals and updates sent meanwhile are kept for it. Only running and waiting runs "
    "are suspended; the others are skipped.",
)
RESUME = RunAction(
    "resume_runs",
    "resume",
    "Resume",
    "resumed",
    "A resumed run becomes runnable and continues where it waits; a timer that came due "
    "while it was suspended fires at once. Only suspended runs are resumed; the others are "
    "skipped.",
)
RETRY = RunAction(
    "retry_runs",
    "retry",
    "Retry",
    "retried",
    "A retried run attempts its failed step afresh; every step before it replays, so "
    "nothing that completed runs again. Only failed runs are retried; the others are "
    "skipped, and so is a failed run whose workflow id another active run holds now.",
)
ACTIONS_BY_NAME: dict[str, RunAction] = {action.name: action for action in (CANCEL, SUSPEND, RESUME, RETRY)}


class ReasonForm(forms.Form):
    """The cancel confirmation's choices: cancel now or request cancellation, and an
    optional reason (stored with each run)."""

    # Not required: a confirmation posted without it (an older page, a script) cancels now.
    mode = forms.ChoiceField(
        choices=CANCEL_MODES, initial="terminate", required=False, widget=forms.RadioSelect
    )
    reason = forms.CharField(
        required=False,
        max_length=1000,
        strip=True,
        widget=forms.TextInput(attrs={"size": 60, "placeholder": "why these runs are cancelled"}),
    )

    def clean_reason(self) -> str:
        reason = str(self.cleaned_data.get("reason") or "")
        if "\x00" in reason:
            raise forms.ValidationError("The reason contains a NUL character; remove it.")
        return reason


# -- the actions --------------------------------------------------------------------------


@admin.action(description="Cancel selected runs", permissions=["cancel"])
def cancel_runs(
    model_admin: RunActionsAdmin, request: HttpRequest, queryset: QuerySet[WorkflowRun]
) -> HttpResponse | None:
    return respond(model_admin, request, queryset, CANCEL)


@admin.action(description="Suspend selected runs", permissions=["suspend"])
def suspend_runs(
    model_admin: RunActionsAdmin, request: HttpRequest, queryset: QuerySet[WorkflowRun]
) -> HttpResponse | None:
    return respond(model_admin, request, queryset, SUSPEND)


@admin.action(description="Resume selected runs", permissions=["suspend"])
def resume_runs(
    model_admin: RunActionsAdmin, request: HttpRequest, queryset: QuerySet[WorkflowRun]
) -> HttpResponse | None:
    return respond(model_admin, request, queryset, RESUME)


@admin.action(description="Retry selected runs", permissions=["cancel"])
def retry_runs(
    model_admin: RunActionsAdmin, request: HttpRequest, queryset: QuerySet[WorkflowRun]
) -> HttpResponse | None:
    return respond(model_admin, request, queryset, RETRY)


RUN_ACTIONS = (cancel_runs, suspend_runs, resume_runs, retry_runs)
"""The ``actions`` of the run admin."""


def respond(
    model_admin: RunActionsAdmin,
    request: HttpRequest,
    queryset: QuerySet[WorkflowRun],
    action: RunAction,
) -> HttpResponse | None:
    """Show the confirmation page, or, once confirmed (``post=yes``), apply the action and
    report. ``None`` sends Django's changelist back to the list it came from."""
    all_matching = request.POST.get(ALL_MATCHING) == "1"
    ids = [] if all_matching else _selected_ids(request)
    runs = queryset if all_matching else model_admin.get_queryset(request).filter(pk__in=ids)
    confirmed = request.POST.get("post") == "yes"
    reason_form = ReasonForm(request.POST if confirmed else None) if action.takes_reason else None
    if not confirmed or (reason_form is not None and not reason_form.is_valid()):
        return _confirmation(model_admin, request, runs, ids, action, all_matching, reason_form)

    reason = (reason_form.cleaned_data["reason"] or None) if reason_form is not None else None
    if reason_form is not None and action is CANCEL and reason_form.cleaned_data["mode"] == "request":
        action = REQUEST_CANCEL
    target: QuerySet[WorkflowRun] | list[uuid.UUID] = ids
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
        target = runs.filter(created_at__lte=as_of) if as_of is not None else runs
    outcome = runtime.apply_bulk(
        action.operation,
        target,
        reason=reason,
        within=None if all_matching else model_admin.get_queryset(request),
    )
    _log_changes(request, action, outcome, reason)
    text, level = outcome_message(action, outcome)
    model_admin.message_user(request, text, level)
    back = return_to(request)
    return HttpResponseRedirect(back) if back else None


def outcome_message(action: RunAction, outcome: runtime.BulkOutcome) -> tuple[str, int]:
    """The message after an action, and its level: how many runs changed, which were
    skipped and why, which failed (a warning when some were skipped, an error when some
    failed)."""
    changed = len(outcome.changed)
    parts = [f"{action.done.capitalize()} {_runs(changed)}." if changed else f"No run was {action.done}."]
    if outcome.skipped:
        groups = "; ".join(f"{reason}: {_labels(runs)}" for reason, runs in outcome.skipped.items())
        parts.append(f"Skipped {outcome.skipped_count}: {groups}.")
    if outcome.failed:
        shown = "; ".join(
            f"{failure.run.label} ({_shorten(failure.error)})" for failure in outcome.failed[:LABELS_SHOWN]
        )
        rest = len(outcome.failed) - LABELS_SHOWN
        more = f"; and {rest} more" if rest > 0 else ""
        parts.append(f"Failed {len(outcome.failed)}: {shown}{more}. The django_weft log has the details.")
    level = messages.ERROR if outcome.failed else messages.WARNING if outcome.skipped else messages.SUCCESS
    return " ".join(parts), level


def _runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


def _labels(runs: Iterable[runtime.BulkRun]) -> str:
    listed = list(runs)
    shown = ", ".join(run.label for run in listed[:LABELS_SHOWN])
    rest = len(listed) - LABELS_SHOWN
    return f"{shown} and {rest} more" if rest > 0 else shown


def _shorten(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _log_changes(
    request: HttpRequest, action: RunAction, outcome: runtime.BulkOutcome, reason: str | None
) -> None:
    """One admin ``LogEntry`` (a change) per changed run, written in bulk."""
    ids = outcome.changed_ids
    runs = WorkflowRun.objects.using(weft_settings.DATABASE_ALIAS).only(
        "id", "workflow_id", "workflow_name", "status"
    )
    for start in range(0, len(ids), 500):
        LogEntry.objects.log_actions(
            user_id=request.user.pk,  # type: ignore[arg-type]  # a staff user, never anonymous
            queryset=list(runs.filter(pk__in=ids[start : start + 500])),
            action_flag=CHANGE,
            change_message=action.history_message(reason),
        )


# -- the confirmation page ------------------------------------------------------------------


def _confirmation(
    model_admin: RunActionsAdmin,
    request: HttpRequest,
    runs: QuerySet[WorkflowRun],
    ids: list[uuid.UUID],
    action: RunAction,
    all_matching: bool,
    reason_form: ReasonForm | None,
) -> HttpResponse | None:
    as_of = timezone.now()
    if all_matching:
        # The confirmed request acts on the runs created up to now, the ones counted here.
        runs = runs.filter(created_at__lte=as_of)
        count = runtime.count_runs(runs)
        if not count:
            model_admin.message_user(
                request, "No run matches the current filter; nothing was changed.", messages.WARNING
            )
            return None
        found: list[uuid.UUID] = []
    else:
        found = list(runs.values_list("pk", flat=True))
        count = len(found)
        if not count:
            model_admin.message_user(
                request, "The selected runs no longer exist; nothing was changed.", messages.WARNING
            )
            return None
    from .runs import status_badge  # imported here: runs.py builds its admin on this module

    shown_runs = runs.only("id", "workflow_id", "workflow_name", "status", "created_at")
    rows = [
        {
            "run": run,
            "badge": status_badge(run.status),
            "refusal": runtime.refusal_for(action.operation, run.status),
        }
        for run in shown_runs.order_by("-created_at", "id")[:RUNS_SHOWN]
    ]
    opts = model_admin.opts
    changelist = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    query = list_query(request)
    back = return_to(request)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"{action.title()}?",
        "opts": opts,
        "app_label": opts.app_label,
        "media": model_admin.media,
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
        "selected_ids": found,
        "filter_words": getattr(request, "weft_filter_words", ""),
        "reason_form": reason_form,
        "form_url": f"{changelist}?{query}" if query else changelist,
        "back_url": back or (f"{changelist}?{query}" if query else changelist),
        "changelist_url": changelist,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, CONFIRM_TEMPLATE, context)


def _selected_ids(request: HttpRequest) -> list[uuid.UUID]:
    ids: dict[uuid.UUID, None] = {}
    for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
        run_id = _as_uuid(value)
        if run_id is not None:
            ids[run_id] = None
    return list(ids)


def _as_uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        return None


# -- the model admin ------------------------------------------------------------------------


class RunActionsAdmin(ConfirmedActionsAdmin):
    """The run admin's actions, their permissions, "apply to all matching" and the lifecycle
    buttons of a run's page. :class:`~django_weft.admin.runs.WorkflowRunAdmin` builds on it."""

    guarded_actions = frozenset(ACTIONS_BY_NAME)

    class Media:
        css = {"all": ("django_weft/actions.css",)}

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """Cancel and retry (``django_weft.cancel_workflowrun``, as in the REST API)."""
        return bool(request.user.has_perm("django_weft.cancel_workflowrun"))

    def has_suspend_permission(self, request: HttpRequest) -> bool:
        """Suspend and resume (``django_weft.suspend_workflowrun``)."""
        return bool(request.user.has_perm("django_weft.suspend_workflowrun"))

    def invalid_selection(self, request: HttpRequest, values: list[str]) -> str | None:
        bad = [value for value in values if _as_uuid(value) is None]
        if not bad:
            return None
        return f"Not a run id: {', '.join(repr(value[:40]) for value in bad[:5])}; nothing was changed."

    def lifecycle_buttons(self, request: HttpRequest, run: WorkflowRun) -> list[RunAction]:
        """The lifecycle actions this user may take on ``run`` and its status allows."""
        offered = self.get_actions(request)
        return [
            action
            for action in ACTIONS_BY_NAME.values()
            if action.name in offered and runtime.refusal_for(action.operation, run.status) is None
        ]

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: WorkflowRun | None = None,
    ) -> HttpResponse:
        if obj is not None:
            opts = self.opts
            context["weft_lifecycle_buttons"] = self.lifecycle_buttons(request, obj)
            context["weft_changelist_url"] = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
            context["weft_return_var"] = RETURN_TO
        return super().render_change_form(request, context, add, change, form_url, obj)


__all__ = [
    "CANCEL",
    "REQUEST_CANCEL",
    "RESUME",
    "RETRY",
    "RUN_ACTIONS",
    "SUSPEND",
    "RunAction",
    "RunActionsAdmin",
    "describe_filters",
    "outcome_message",
]
