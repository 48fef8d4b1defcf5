"""The object tools: **Send signal**, **Send update** and **Run query** on a run's page,
**Start workflow** on the run list.

Each tool is an admin page with a form. The views call the runtime as the REST API does,
behind the API's permissions (the catalogue's, :data:`TOOL_OPERATIONS`), checked on every request, GET
and POST alike. Bad input is an error on the form, never a server error, and then
nothing is sent: the form checks what it can (JSON, sizes, control characters,
durations), the runtime checks the rest and its errors are added to the form. Nothing here
writes a run's rows; what was sent or started is recorded in Django's admin log
(``LogEntry``), as the admin does for its own changes.

The views are exempt from ``ATOMIC_REQUESTS`` (:func:`..common.tools.non_atomic_view`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.html import escape, format_html

from ... import runtime
from ...conf import weft_settings
from ...engine.errors import (
    PayloadError,
    QueryFailed,
    UnknownHandler,
    UpdateFailed,
    UpdateTimeout,
    UpdateValidationError,
    WeftError,
    WorkflowAlreadyExists,
    WorkflowNotFound,
    WorkflowNotRegistered,
)
from ...engine.records import RunStatus
from ...models import Update, WorkflowRun
from ...runtime.operations import OPERATIONS
from ..common.display import pretty_json
from ..common.forms import as_sentence
from ..common.tools import Outcome, ToolView, non_atomic_view
from ..common.urls import url_name
from .forms import QueryForm, SignalForm, StartWorkflowForm, UpdateForm

TOOL_OPERATIONS = ("signal", "update", "query", "start")
"""Each tool is the catalogue's operation of its name, behind that operation's permissions
(the REST API's for the same call; a query only reads, so viewing runs is enough)."""


def may(request: HttpRequest, tool: str) -> bool:
    """Whether the request's user may use ``tool``: active staff with its permissions."""
    return OPERATIONS[tool].allowed(request.user)


def tool_urls(model_admin: admin.ModelAdmin[WorkflowRun]) -> list[URLPattern]:
    """The tools' routes, to go before the admin's own (``<object_id>/`` would match them):
    ``start/``, ``<object_id>/signal/``, ``<object_id>/update/``, ``<object_id>/query/``,
    named ``admin:django_weft_workflowrun_<tool>``."""
    return [
        path("start/", non_atomic_view(model_admin, StartWorkflowView), name=url_name(WorkflowRun, "start")),
        *(
            path(
                f"<path:object_id>/{view.tool}/",
                non_atomic_view(model_admin, view),
                name=url_name(WorkflowRun, view.tool),
            )
            for view in (SendSignalView, SendUpdateView, RunQueryView)
        ),
    ]


class WorkflowRunToolView(ToolView):
    """A tool of the run admin, behind the permissions of its operation."""

    def may_use(self, request: HttpRequest) -> bool:
        return may(request, self.tool)

    def denied_message(self) -> str:
        return f"You need the {' and '.join(OPERATIONS[self.tool].permissions)} permission for this."


# -- the run's tools --------------------------------------------------------------------------


class RunToolView(WorkflowRunToolView):
    """A tool for one run (``<object_id>/<tool>/``)."""

    takes_finished_runs: ClassVar[bool] = False
    what: ClassVar[str]
    """What the tool sends, in the plural ("signals"), for the page of a finished run."""
    payload_field: ClassVar[str] = "payload"

    def get(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self.run(request, object_id)
        return self.page(request, run, self.form_class(initial=self.initial(request)))

    def post(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self.run(request, object_id)
        form = self.form_class(request.POST)
        outcome: Outcome | None = None
        known: Sequence[str] = ()
        if form.is_valid():
            try:
                answer = self.send(request, run, form.cleaned_data)
            except WorkflowNotFound:
                # Removed by retention since the page was read.
                messages.error(request, f"Run {run.pk} no longer exists; nothing was sent.")
                return HttpResponseRedirect(self.url("changelist"))
            except UnknownHandler as exc:
                self.add_error(form, exc, "name")
                known = list(getattr(exc, "registered", None) or [])
            except UpdateValidationError as exc:
                issues = getattr(exc, "issues", None) or [{"field": None, "message": exc.message}]
                for issue in issues:
                    where, message = issue.get("field"), str(issue.get("message"))
                    form.add_error(self.payload_field, f"{where}: {message}" if where else message)
            except PayloadError as exc:
                self.add_error(form, exc, self.payload_field)
            except WeftError as exc:
                self.add_error(form, exc)
            else:
                if isinstance(answer, HttpResponse):
                    return answer
                outcome = answer
            run = self.fresh(run)
        return self.page(request, run, form, outcome, known)

    def page(
        self,
        request: HttpRequest,
        run: WorkflowRun,
        form: forms.Form,
        outcome: Outcome | None = None,
        known: Sequence[str] = (),
    ) -> TemplateResponse:
        closed = None
        if run.is_terminal and not self.takes_finished_runs:
            closed = (
                f"This run has finished ({WorkflowRun.Status(run.status).label}): a finished run takes no "
                f"{self.what}. Start a new run to send it {self.what}."
            )
        names = list(known) or self.known_names(run)
        if names and "name" in form.fields:
            # The admin's fieldset shows help text unescaped.
            hint = escape(self.names_hint(", ".join(names)))
            form.fields["name"].help_text = f"{form.fields['name'].help_text} {hint}"
        return self.render(request, form, obj=run, outcome=outcome, closed=closed, known_names=names)

    def run(self, request: HttpRequest, object_id: str) -> WorkflowRun:
        run = self.admin.get_object(request, unquote(object_id))
        if run is None:
            raise Http404(f"No workflow run has the id {object_id!r}.")
        return run

    @staticmethod
    def fresh(run: WorkflowRun) -> WorkflowRun:
        """The run as it is now (the tool may have moved it on, or it finished meanwhile)."""
        try:
            return runtime.get_run(run.pk)
        except WorkflowNotFound:
            return run

    def back_to_run(self, request: HttpRequest, run: WorkflowRun) -> HttpResponseRedirect:
        """The run's page, or this tool's page for a user who may not view runs."""
        if self.admin.has_view_permission(request, run):
            return HttpResponseRedirect(self.url("change", run.pk))
        return HttpResponseRedirect(request.path)

    def initial(self, request: HttpRequest) -> dict[str, Any]:
        """Fields filled from the query string (``?name=approve``), as a link may set them."""
        return {name: request.GET[name] for name in ("name",) if name in request.GET}

    def known_names(self, run: WorkflowRun) -> list[str]:
        """Names the run takes where it is parked, when its ``waiting_on`` says so."""
        return []

    def names_hint(self, listed: str) -> str:
        return f"Known handlers: {listed}."

    def send(self, request: HttpRequest, run: WorkflowRun, data: dict[str, Any]) -> Outcome | HttpResponse:
        raise NotImplementedError


class SendSignalView(RunToolView):
    tool = "signal"
    title = "Send signal"
    submit_label = "Send signal"
    form_class = SignalForm
    what = "signals"

    def known_names(self, run: WorkflowRun) -> list[str]:
        return [str(name) for name in (run.waiting_on or {}).get("signals") or []]

    def names_hint(self, listed: str) -> str:
        return f"Where it is parked, the run waits for or handles: {listed}."

    def send(self, request: HttpRequest, run: WorkflowRun, data: dict[str, Any]) -> Outcome | HttpResponse:
        name, signal_id = data["name"], data["signal_id"] or None
        accepted = runtime.signal(str(run.pk), name, data["payload"], signal_id=signal_id)
        if accepted.duplicate:
            messages.info(
                request,
                f"Signal {name} with signal id {signal_id} had been accepted already (#{accepted.sequence}); "
                "nothing new was stored.",
            )
            return self.back_to_run(request, run)
        shown_id = f" (signal id {signal_id})" if signal_id else ""
        self.admin.log_change(request, run, f"Sent signal {name}{shown_id}.")
        messages.success(request, f"Signal {name}{shown_id} sent to {run}: stored as #{accepted.sequence}.")
        waited = self.known_names(run)
        if run.status == RunStatus.SUSPENDED:
            messages.info(request, "The run is suspended: the signal is kept until it is resumed.")
        elif run.status == RunStatus.WAITING and run.waiting_on and name not in waited:
            messages.warning(
                request,
                f"Where it is parked, the run does not wait for signal {name} "
                f"(it takes {', '.join(waited) or 'no signals'}); the signal is kept until the "
                "workflow asks for it.",
            )
        return self.back_to_run(request, run)


class HandlersOfRun(RunToolView):
    """A tool whose names are the handlers the workflow registered: found by a read-only
    replay of the run's history, as a query finds its handler (handlers are registered by
    running workflow code, so no other place knows them), offered by name with their
    parameters."""

    handler_kind: ClassVar[str]
    _handlers: list[runtime.HandlerInfo] | None = None  # read once per request (a view per request)

    def known_names(self, run: WorkflowRun) -> list[str]:
        return [handler.name for handler in self.handlers(run)]

    def handlers(self, run: WorkflowRun) -> list[runtime.HandlerInfo]:
        if self._handlers is None:
            try:
                every = runtime.registered_handlers(str(run.pk)) or []
            except WorkflowNotFound:
                every = []
            self._handlers = [handler for handler in every if handler.kind == self.handler_kind]
        return self._handlers

    def names_hint(self, listed: str) -> str:
        hints = ", ".join(handler.hint for handler in self._handlers or []) or listed
        return f"The {self.handler_kind} handlers the run has registered where it is: {hints}."


class SendUpdateView(HandlersOfRun):
    tool = "update"
    title = "Send update"
    submit_label = "Send update"
    form_class = UpdateForm
    what = "updates"
    handler_kind = "update"

    def known_names(self, run: WorkflowRun) -> list[str]:
        parked = [str(name) for name in (run.waiting_on or {}).get("updates") or []]
        return parked or super().known_names(run)

    def send(self, request: HttpRequest, run: WorkflowRun, data: dict[str, Any]) -> Outcome | HttpResponse:
        name, wait = data["name"], data["wait"]
        update_id = data["update_id"] or uuid.uuid4().hex
        # A repeated update id returns the first outcome: only a new update goes in the log.
        repeated = bool(data["update_id"]) and (
            Update.objects.using(weft_settings.DATABASE_ALIAS).filter(run=run, update_id=update_id).exists()
        )
        what = f"Update {name} (update id {update_id})"
        try:
            result = runtime.update(str(run.pk), name, data["payload"], update_id=update_id, wait=wait)
        except UpdateTimeout:
            self.log(request, run, name, update_id, repeated)
            return Outcome(
                "Accepted, no result yet",
                f"{what} is accepted and stored, but the run has not applied it within {wait:g} s. "
                "The run applies it when it gets to it; the outcome will show in the updates table "
                "of the run's page.",
            )
        except UpdateFailed as exc:
            self.log(request, run, name, update_id, repeated)
            trace = getattr(exc, "error_traceback", None)
            return Outcome(
                "The handler failed",
                f"{what} was applied, but its handler raised {getattr(exc, 'error_type', None)}: "
                f"{getattr(exc, 'error_message', None)}. The run goes on.",
                value=format_html('<pre class="weft-traceback">{}</pre>', trace) if trace else None,
                failed=True,
            )
        self.log(request, run, name, update_id, repeated)
        return Outcome("Result", f"{what} was applied; the handler returned:", value=pretty_json(result))

    def log(self, request: HttpRequest, run: WorkflowRun, name: str, update_id: str, repeated: bool) -> None:
        if not repeated:
            self.admin.log_change(request, run, f"Sent update {name} (update id {update_id}).")


class RunQueryView(HandlersOfRun):
    tool = "query"
    title = "Run query"
    submit_label = "Run query"
    form_class = QueryForm
    takes_finished_runs = True
    what = "queries"
    payload_field = "args"
    handler_kind = "query"

    def send(self, request: HttpRequest, run: WorkflowRun, data: dict[str, Any]) -> Outcome | HttpResponse:
        name = data["name"]
        try:
            result = runtime.query(str(run.pk), name, data["args"])
        except QueryFailed as exc:
            return Outcome("The query failed", as_sentence(exc.message), failed=True)
        return Outcome("Result", f"Query {name} answered:", value=pretty_json(result))


# -- Start workflow -----------------------------------------------------------------------------


class StartWorkflowView(WorkflowRunToolView):
    """``start/``: start a run of a registered workflow, then show it."""

    tool = "start"
    title = "Start workflow"
    submit_label = "Start"
    form_class = StartWorkflowForm

    def get(self, request: HttpRequest) -> HttpResponse:
        initial = {"workflow": request.GET["workflow"]} if "workflow" in request.GET else {}
        return self.render(request, StartWorkflowForm(initial=initial))

    def post(self, request: HttpRequest) -> HttpResponse:
        form = StartWorkflowForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            try:
                started = runtime.start(
                    data["workflow"],
                    data["args"],
                    data["kwargs"],
                    id=data["workflow_id"] or None,
                    on_conflict=data["on_conflict"],
                    execution_timeout=data["execution_timeout"],
                    start_delay=data["start_delay"],
                    search_attributes=data["search_attributes"],
                    priority=data["priority"],
                )
            except WorkflowAlreadyExists as exc:
                self.add_error(form, exc, "workflow_id")
            except WorkflowNotRegistered as exc:
                self.add_error(form, exc, "workflow")
            except WeftError as exc:  # the arguments do not fit, a bad id or payload, no slot...
                self.add_error(form, exc, getattr(exc, "field", None))
            else:
                return self.started(request, started, asked_id=data["workflow_id"] or None)
        return self.render(request, form)

    def started(
        self, request: HttpRequest, started: runtime.StartResult, asked_id: str | None = None
    ) -> HttpResponse:
        run = runtime.get_run(started.run_id)
        if started.created:
            self.admin.log_addition(
                request, run, f"Started workflow {run.workflow_name} (workflow id {run.workflow_id})."
            )
            messages.success(request, f"Started {run.workflow_name} {run.workflow_id}: run {run.pk}.")
        elif run.workflow_id != asked_id:
            # Concurrency(on_limit="skip"): the run holding the key stands for the start.
            where = f"key {run.concurrency_key}" if run.concurrency_key else "the workflow"
            messages.warning(
                request,
                f"Every concurrency slot of {where} is taken (the oldest by run {run.pk}, "
                f"{run.workflow_id}), and {run.workflow_name} skips starts until one frees; no new "
                "run was started.",
            )
        else:
            status = WorkflowRun.Status(run.status).label
            messages.warning(
                request,
                f"A run with workflow id {run.workflow_id} already exists ({status}); "
                "no new run was started.",
            )
        if self.admin.has_view_permission(request, run):
            return HttpResponseRedirect(self.url("change", run.pk))
        return HttpResponseRedirect(request.path)
