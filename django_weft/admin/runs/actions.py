"""The run admin's lifecycle actions: cancel, suspend, resume and retry runs.

Each action works like Django's ``delete_selected``: choosing it on the changelist shows a
confirmation page listing the runs; confirming applies the operation through
:func:`django_weft.runtime.apply_bulk` (each run in its own transaction), reports the
outcome per run with ``message_user`` and records each changed run in the admin's
``LogEntry`` history. The page is the one confirmation flow (:mod:`..common.confirmation`); it serves:

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
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse

from ... import runtime
from ...models import WorkflowRun
from ...runtime.operations import CANCEL_REASON, OPERATIONS
from ..common.confirmation import (
    Applied,
    ConfirmationFlow,
    ConfirmedAction,
    Found,
    confirmed_action,
    ticked,
)
from ..common.display import listed, shorten, status_badge
from ..common.selection import RETURN_TO, ConfirmedActionsAdmin, describe_filters
from ..common.urls import admin_url

RUNS_SHOWN = 100
"""Runs listed on a confirmation page; the rest are counted."""
LABELS_SHOWN = 10
"""Runs named per skip reason (or among failures) in an outcome message."""
CONFIRM_TEMPLATE = "admin/django_weft/workflowrun/confirm_action.html"
CANCEL_MODES = tuple((choice.value, choice.label) for choice in OPERATIONS["cancel"].choices["mode"])


class ReasonForm(forms.Form):
    """The cancel confirmation's choices: cancel now or request cancellation, and an
    optional reason (stored with each run)."""

    # Not required: a confirmation posted without it (an older page, a script) cancels now.
    mode = forms.ChoiceField(
        choices=CANCEL_MODES, initial="terminate", required=False, widget=forms.RadioSelect
    )
    reason = forms.CharField(
        required=False,
        max_length=CANCEL_REASON.max_length,
        strip=True,
        widget=forms.TextInput(attrs={"size": 60, "placeholder": "why these runs are cancelled"}),
    )

    def clean_reason(self) -> str:
        reason = str(self.cleaned_data.get("reason") or "")
        if "\x00" in reason:
            raise forms.ValidationError("The reason contains a NUL character; remove it.")
        return reason


@dataclass(frozen=True)
class RunAction(ConfirmedAction):
    """One lifecycle action as the admin offers it (``operation``: the
    :func:`~django_weft.runtime.apply_bulk` operation)."""

    what: str = "workflow runs"

    @property
    def takes_reason(self) -> bool:
        return self.options is ReasonForm

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
    permission="cancel",
    options=ReasonForm,
)
REQUEST_CANCEL = RunAction(
    "cancel_runs",
    "request_cancel",
    "Request cancellation of",
    "asked to cancel",
    "",
    permission="cancel",
    options=ReasonForm,
)
"""The cancel action confirmed with "request cancellation": its operation and messages."""
SUSPEND = RunAction(
    "suspend_runs",
    "suspend",
    "Suspend",
    "suspended",
    "No worker drives a suspended run until it is resumed; it keeps its history and timers, "
    "and signals and updates sent meanwhile are kept for it. Only running and waiting runs "
    "are suspended; the others are skipped.",
    permission="suspend",
)
RESUME = RunAction(
    "resume_runs",
    "resume",
    "Resume",
    "resumed",
    "A resumed run becomes runnable and continues where it waits; a timer that came due "
    "while it was suspended fires at once. Only suspended runs are resumed; the others are "
    "skipped.",
    permission="suspend",
)
RETRY = RunAction(
    "retry_runs",
    "retry",
    "Retry",
    "retried",
    "A retried run attempts its failed step afresh; every step before it replays, so "
    "nothing that completed runs again. Only failed runs are retried; the others are "
    "skipped, and so is a failed run whose workflow id another active run holds now.",
    permission="cancel",
)
ACTIONS_BY_NAME: dict[str, RunAction] = {action.name: action for action in (CANCEL, SUSPEND, RESUME, RETRY)}


class RunConfirmation(ConfirmationFlow):
    """A lifecycle action's confirmation: the runs it reaches, applied through
    :func:`django_weft.runtime.apply_bulk` (each run in its own transaction)."""

    template = CONFIRM_TEMPLATE
    noun = "run"

    def selected_ids(self) -> list[uuid.UUID]:
        return ticked(self.request, _as_uuid)

    def find(self, rows: QuerySet[WorkflowRun], all_matching: bool) -> Found:
        if all_matching:
            return Found(runtime.count_runs(rows), [], [])
        found = list(rows.values_list("pk", flat=True))
        return Found(len(found), found, [])

    def table(self, rows: QuerySet[WorkflowRun], found: Found) -> list[dict[str, Any]]:
        shown = rows.only("id", "workflow_id", "workflow_name", "status", "created_at")
        return [
            {
                "run": run,
                "badge": status_badge(run.status),
                "refusal": runtime.refusal_for(self.action.operation, run.status),
            }
            for run in shown.order_by("-created_at", "id")[:RUNS_SHOWN]
        ]

    def apply(
        self, rows: QuerySet[WorkflowRun], ids: list[Any], all_matching: bool, chosen: dict[str, Any]
    ) -> Applied:
        action = self.action
        reason = (chosen["reason"] or None) if action.takes_reason else None
        if action is CANCEL and chosen.get("mode") == "request":
            action = REQUEST_CANCEL
        outcome = runtime.apply_bulk(
            action.operation,
            rows if all_matching else ids,
            reason=reason,
            within=None if all_matching else self.model_admin.get_queryset(self.request),
        )
        _log_changes(self.request, action, outcome, reason)
        text, level = outcome_message(action, outcome)
        return Applied(text, level)


cancel_runs = confirmed_action(CANCEL, "Cancel selected runs", RunConfirmation)
suspend_runs = confirmed_action(SUSPEND, "Suspend selected runs", RunConfirmation)
resume_runs = confirmed_action(RESUME, "Resume selected runs", RunConfirmation)
retry_runs = confirmed_action(RETRY, "Retry selected runs", RunConfirmation)

RUN_ACTIONS = (cancel_runs, suspend_runs, resume_runs, retry_runs)
"""The ``actions`` of the run admin."""


def outcome_message(action: RunAction, outcome: runtime.BulkOutcome) -> tuple[str, int]:
    """The message after an action, and its level: how many runs changed, which were
    skipped and why, which failed (a warning when some were skipped, an error when some
    failed)."""
    changed = len(outcome.changed)
    parts = [f"{action.done.capitalize()} {_runs(changed)}." if changed else f"No run was {action.done}."]
    if outcome.skipped:
        groups = "; ".join(
            f"{reason}: {listed((run.label for run in runs), LABELS_SHOWN)}"
            for reason, runs in outcome.skipped.items()
        )
        parts.append(f"Skipped {outcome.skipped_count}: {groups}.")
    if outcome.failed:
        shown = "; ".join(
            f"{failure.run.label} ({shorten(failure.error)})" for failure in outcome.failed[:LABELS_SHOWN]
        )
        rest = len(outcome.failed) - LABELS_SHOWN
        more = f"; and {rest} more" if rest > 0 else ""
        parts.append(f"Failed {len(outcome.failed)}: {shown}{more}. The django_weft log has the details.")
    level = messages.ERROR if outcome.failed else messages.WARNING if outcome.skipped else messages.SUCCESS
    return " ".join(parts), level


def _runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


def _log_changes(
    request: HttpRequest, action: RunAction, outcome: runtime.BulkOutcome, reason: str | None
) -> None:
    """One admin ``LogEntry`` (a change) per changed run, written in bulk."""
    ids = outcome.changed_ids
    runs = runtime.run_queryset().only("id", "workflow_id", "workflow_name", "status")
    for start in range(0, len(ids), 500):
        LogEntry.objects.log_actions(
            user_id=request.user.pk,  # type: ignore[arg-type]  # a staff user, never anonymous
            queryset=list(runs.filter(pk__in=ids[start : start + 500])),
            action_flag=CHANGE,
            change_message=action.history_message(reason),
        )


def _as_uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        return None


# -- the model admin ------------------------------------------------------------------------


class RunActionsAdmin(ConfirmedActionsAdmin):
    """The run admin's actions, their permissions, "apply to all matching" and the lifecycle
    buttons of a run's page. :class:`~django_weft.admin.runs.admin.WorkflowRunAdmin` builds on it."""

    guarded_actions = frozenset(ACTIONS_BY_NAME)

    class Media:
        css = {"all": ("django_weft/actions.css",)}

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """Cancel and retry: the catalogue's permissions of these operations."""
        return OPERATIONS["cancel"].allowed(request.user) and OPERATIONS["retry"].allowed(request.user)

    def has_suspend_permission(self, request: HttpRequest) -> bool:
        """Suspend and resume: the catalogue's permissions of these operations."""
        return OPERATIONS["suspend"].allowed(request.user) and OPERATIONS["resume"].allowed(request.user)

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
            context["weft_lifecycle_buttons"] = self.lifecycle_buttons(request, obj)
            context["weft_changelist_url"] = admin_url(WorkflowRun, "changelist")
            context["weft_return_var"] = RETURN_TO
        return super().render_change_form(request, context, add, change, form_url, obj)


__all__ = [
    "CANCEL",
    "CANCEL_MODES",
    "REQUEST_CANCEL",
    "RESUME",
    "RETRY",
    "RUN_ACTIONS",
    "SUSPEND",
    "ReasonForm",
    "RunAction",
    "RunActionsAdmin",
    "RunConfirmation",
    "describe_filters",
    "outcome_message",
]
