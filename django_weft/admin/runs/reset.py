"""**Reset to this step**: each entry of a run's steps table links to a confirmation page
(``<object_id>/reset/?to_seq=N``) that says what the reset keeps, runs again and closes,
and asks for a reason; confirming calls :func:`django_weft.runtime.reset`.

Both the page and its POST need ``cancel_workflowrun`` and ``add_workflowrun`` (a reset
closes a run and starts one, as in the REST API); anyone else gets 403, and a refused or
forged POST writes nothing. The runtime's refusals (a position the history cannot be cut
at, a run that is not the latest of its workflow id) are errors on the form.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.html import format_html

from ... import runtime
from ...engine.errors import WeftError
from ...models import WorkflowRun
from ...runtime.operations import OPERATIONS, RESET_REASON
from ..common.forms import JSONTextField, as_sentence
from ..common.tools import Outcome, non_atomic_view
from ..common.urls import url_name
from .tools import RunToolView

RESET_PERMISSIONS = OPERATIONS["reset"].permissions
"""What a reset needs: it closes a run (cancel) and starts one (add)."""
TEMPLATE = "admin/django_weft/workflowrun/reset_form.html"
SHOWN_AROUND = 2
"""Entries shown on each side of the cut on the confirmation page."""


def may_reset(request: HttpRequest) -> bool:
    """Whether the request's user may reset runs: active staff with both permissions."""
    return OPERATIONS["reset"].allowed(request.user)


def newer_run(run: WorkflowRun) -> WorkflowRun | None:
    """The latest run of ``run``'s workflow id if it is not ``run`` (then ``run`` cannot be reset)."""
    return (
        runtime.run_queryset(same_database_as=run)
        .filter(workflow_id=run.workflow_id, created_at__gt=run.created_at)
        .only("id", "workflow_id", "workflow_name", "status", "created_at")
        .order_by("-created_at")
        .first()
    )


class ResetForm(forms.Form):
    to_seq = forms.IntegerField(
        label="Reset to position",
        help_text="The new run keeps (replays) the entries before this position and runs this one and "
        "every later one again.",
    )
    reason = forms.CharField(
        max_length=RESET_REASON.max_length,
        strip=True,
        widget=forms.TextInput(attrs={"size": 60, "placeholder": "why this run is reset"}),
        help_text="Required; stored on both runs.",
    )
    args = JSONTextField(
        expect=list,
        what="args",
        help_text="Optional: new positional input as a JSON list. Empty: the run's, shown below.",
    )
    kwargs = JSONTextField(
        expect=dict,
        what="kwargs",
        help_text="Optional: new keyword input as a JSON object. Empty: the run's.",
    )

    def clean_reason(self) -> str:
        reason = str(self.cleaned_data.get("reason") or "")
        if "\x00" in reason:
            raise forms.ValidationError("The reason contains a NUL character; remove it.")
        return reason


class ResetView(RunToolView):
    tool = "reset"
    title = "Reset to a step"
    submit_label = "Reset"
    form_class = ResetForm
    template_name = TEMPLATE
    takes_finished_runs = True
    what = "resets"
    back_label = "Back to the run, no reset"

    def may_use(self, request: HttpRequest) -> bool:
        # A reset needs two permissions (the catalogue's), not one like the other tools.
        return may_reset(request)

    def denied_message(self) -> str:
        return "A reset needs the cancel_workflowrun and add_workflowrun permissions."

    def initial(self, request: HttpRequest) -> dict[str, Any]:
        return {"to_seq": request.GET["to_seq"]} if "to_seq" in request.GET else {}

    @staticmethod
    def add_error(form: forms.Form, exc: WeftError, field: str | None = None) -> None:
        named = getattr(exc, "field", None)
        form.add_error(named if named in form.fields else field, as_sentence(exc.message))

    def page(
        self,
        request: HttpRequest,
        run: WorkflowRun,
        form: forms.Form,
        outcome: Outcome | None = None,
        known: Any = (),
    ) -> TemplateResponse:
        response = super().page(request, run, form, outcome, known)
        assert response.context_data is not None
        response.context_data.update(self.preview(run, form))
        return response

    def preview(self, run: WorkflowRun, form: forms.Form) -> dict[str, Any]:
        """What the page says about the cut: the entries around it, and what happens to the run."""
        raw = form.data.get("to_seq") if form.is_bound else form.initial.get("to_seq")
        try:
            to_seq: int | None = int(str(raw))
        except (TypeError, ValueError):
            to_seq = None
        entries = runtime.read_history(run, payloads=False)
        around: list[dict[str, Any]] = []
        if to_seq is not None:
            around = [
                {"entry": entry, "kept": entry.seq < to_seq}
                for entry in entries
                if to_seq - SHOWN_AROUND <= entry.seq < to_seq + SHOWN_AROUND
            ]
        newer = newer_run(run)
        return {
            "weft_reset_to_seq": to_seq,
            "weft_reset_entries": len(entries),
            "weft_reset_around": around,
            "weft_reset_newer": newer,
            "weft_reset_closes": not run.is_terminal,
            "weft_reset_input": format_html(
                "args {} kwargs {}",
                JSONTextField().prepare_value(run.args),
                JSONTextField().prepare_value(run.kwargs),
            ),
        }

    def send(self, request: HttpRequest, run: WorkflowRun, data: dict[str, Any]) -> Outcome | HttpResponse:
        outcome = runtime.reset(
            str(run.pk), data["to_seq"], args=data["args"], kwargs=data["kwargs"], reason=data["reason"]
        )
        new = runtime.get_run(outcome.run_id)
        position, why = outcome.to_seq, data["reason"]
        self.admin.log_change(request, run, f"Reset to position {position} as run {new.pk} (reason: {why}).")
        self.admin.log_addition(
            request, new, f"Started by resetting run {run.pk} to position {position} (reason: {why})."
        )
        kept = f"{position} entr{'y' if position == 1 else 'ies'}"
        closed = " The old run was closed (cancelled)." if outcome.closed else ""
        messages.success(
            request,
            f"Reset {run.workflow_name} {run.workflow_id} to position {position}: new run {new.pk} keeps "
            f"the {kept} before it and continues from there.{closed}",
        )
        return self.back_to_run(request, new)


def reset_urls(model_admin: admin.ModelAdmin[WorkflowRun]) -> list[URLPattern]:
    """``<object_id>/reset/``, named ``admin:django_weft_workflowrun_reset`` (before the
    admin's own routes, which ``<object_id>/`` would otherwise match)."""
    view = non_atomic_view(model_admin, ResetView)
    return [path("<path:object_id>/reset/", view, name=url_name(WorkflowRun, "reset"))]


__all__ = ["RESET_PERMISSIONS", "ResetForm", "ResetView", "may_reset", "newer_run", "reset_urls"]
