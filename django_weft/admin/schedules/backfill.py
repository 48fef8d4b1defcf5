"""The schedule's **Backfill** tool (``<schedule id>/backfill/``): fire each scheduled time
of a range once, now, through :func:`django_weft.runtime.backfill_schedule`, behind the
``trigger_schedule`` permission; then a table of what each fire did.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from ... import runtime
from ...engine.errors import ScheduleNotFound, WeftError
from ...engine.schedule_spec import InvalidSchedule
from ...models import Schedule, WorkflowRun
from ...runtime.operations import BACKFILL_LIMIT, OPERATIONS
from ..common.tools import Outcome, ToolView
from ..common.urls import admin_url
from .actions import fire_words
from .display import OUTCOME_LABELS, local_and_utc, operator_in_utc, outcome_badge
from .forms import BackfillForm

BACKFILL_ROWS_SHOWN = 100
"""Fires listed after a backfill; the rest are counted."""


class BackfillView(ToolView):
    """``<schedule id>/backfill/``: fire each scheduled time of a range once, now."""

    tool = "backfill"
    title = "Backfill"
    submit_label = "Backfill"
    form_class = BackfillForm
    template_name = "admin/django_weft/schedule/backfill.html"
    back_label = "Back to the schedule"

    def may_use(self, request: HttpRequest) -> bool:
        return OPERATIONS["backfill"].allowed(request.user)

    def denied_message(self) -> str:
        return "You need the trigger_schedule permission to backfill."

    def schedule(self, request: HttpRequest, object_id: str) -> Schedule:
        found = self.admin.get_object(request, unquote(object_id))
        if found is None:
            raise Http404(f"No schedule has the id {object_id!r}.")
        return found

    def get(self, request: HttpRequest, object_id: str) -> HttpResponse:
        schedule = self.schedule(request, object_id)
        return self.render(request, BackfillForm(), obj=schedule)

    def post(self, request: HttpRequest, object_id: str) -> HttpResponse:
        schedule = self.schedule(request, object_id)
        form = BackfillForm(request.POST)
        outcome: Outcome | None = None
        # The runtime refuses a range of more than BACKFILL_LIMIT times (an error on "end")
        # before it starts anything, as it does for the REST API and Python.
        if form.is_valid():
            data = form.cleaned_data
            try:
                fires = runtime.backfill_schedule(
                    schedule.pk, data["start"], data["end"], overlap=data["overlap"]
                )
            except InvalidSchedule as exc:
                self.add_error(form, exc, exc.field)
            except ScheduleNotFound:
                messages.error(request, f"Schedule {schedule.pk} no longer exists; nothing was backfilled.")
                return HttpResponseRedirect(self.url("changelist"))
            except WeftError as exc:
                self.add_error(form, exc)
            else:
                outcome = backfill_outcome(data["start"], data["end"], fires)
                if fires:
                    self.admin.log_change(request, schedule, f"Backfilled: {outcome.summary}")
        return self.render(request, form, obj=schedule, outcome=outcome)

    def render(self, request: HttpRequest, form: forms.Form, **kwargs: Any) -> TemplateResponse:
        response = super().render(request, form, **kwargs)
        response.context_data["weft_zone"] = timezone.get_current_timezone_name()  # type: ignore[index]
        return response


def backfill_outcome(start: datetime, end: datetime, fires: list[dict[str, Any]]) -> Outcome:
    """What a backfill did: how many times in the range, and what each fire did."""
    first, _ = local_and_utc(start)
    last, _ = local_and_utc(end)
    if not fires:
        return Outcome("Nothing to backfill", f"No scheduled time falls between {first} and {last}.")
    counts: dict[str, int] = {}
    for fire in fires:
        label = OUTCOME_LABELS.get(str(fire.get("outcome")), str(fire.get("outcome")))
        counts[label] = counts.get(label, 0) + 1
    tally = ", ".join(f"{count} {label}" for label, count in counts.items())
    summary = f"{len(fires)} scheduled time{'s' if len(fires) != 1 else ''} from {first} to {last}: {tally}."
    with_utc = not operator_in_utc()
    rows = format_html_join(
        "",
        "<tr><td>{}</td>{}<td>{}</td><td>{}</td></tr>",
        (
            (
                local,
                format_html("<td>{}</td>", utc) if with_utc else "",
                outcome_badge(str(fire.get("outcome"))),
                _fire_cell(fire),
            )
            for fire in fires[:BACKFILL_ROWS_SHOWN]
            for local, utc in [local_and_utc(fire.get("scheduled_at"))]
        ),
    )
    more = len(fires) - BACKFILL_ROWS_SHOWN
    table = format_html(
        '<table class="weft-backfill-fires"><thead><tr><th>scheduled</th>{}'
        "<th>outcome</th><th>run</th></tr></thead><tbody>{}</tbody></table>{}",
        mark_safe("<th>UTC</th>") if with_utc else "",
        rows,
        format_html('<p class="help">… and {} more</p>', more) if more > 0 else "",
    )
    failed = any(fire.get("outcome") == "error" for fire in fires)
    return Outcome("Backfilled", summary, value=table, failed=failed)


def _fire_cell(fire: dict[str, Any]) -> SafeString | str:
    if fire.get("run_id"):
        url = admin_url(WorkflowRun, "change", fire["run_id"])
        return format_html('<a href="{}">{}</a>', url, fire.get("workflow_id") or fire["run_id"])
    return fire_words(fire)


__all__ = ["BACKFILL_LIMIT", "BackfillView", "backfill_outcome"]
