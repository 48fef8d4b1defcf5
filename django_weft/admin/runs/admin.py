"""The workflow runs' admin: a changelist that stays fast on millions of rows and a
read-only detail page with the step timeline.

Reads only: rows are listed through the runtime's run queryset (as the REST list does)
and a run's history through :mod:`django_weft.runtime`; nothing here writes a row. The
list and a run's page only show rows, so they read ``WEFT_READ_DATABASE``
(:mod:`..common.reads`); what a run's page reads about the run comes from where the run
was read.
"""

from __future__ import annotations

import math
from typing import Any

from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin.sites import all_sites
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ... import runtime
from ...engine.records import TERMINAL_STATUSES, CancelRequest, RunStatus
from ...engine.reset import ResetLink
from ...models import Schedule, WorkflowRun
from ...runtime.operations import OPERATIONS
from ...runtime.starts import RELATED_OBJECT_ATTRIBUTE
from .. import timeline
from ..common.display import json_block, moment_field, pretty_json, run_link, status_badge, zoned_moment
from ..common.reads import reads_may_lag, show_only
from ..common.urls import admin_url
from .actions import RUN_ACTIONS, RunActionsAdmin
from .changelist import (
    ConcurrencyKeyFilter,
    FinishedFilter,
    FlowControlFilter,
    HasParentFilter,
    KindFilter,
    LookAheadPaginator,
    OverdueFilter,
    RunChangeList,
    WorkflowNameFilter,
    queue_of,
)
from .dashboard import dashboard_urls
from .forms import SearchError, as_run_id, parse_run_search
from .reset import may_reset, reset_urls
from .tables import error_html, signals_rows, steps_rows, timers_rows, updates_rows
from .tools import tool_urls
from .waits import describe_wait, waited_positions

LIVE_REFRESH_SECONDS: dict[str, int] = {RunStatus.PENDING: 2, RunStatus.RUNNING: 2, RunStatus.WAITING: 5}
"""How often a live run's page reloads its content, by status (others: 5 s); the reader
can turn it off."""

CHILDREN_SHOWN = 100
STEPS_PER_PAGE = 200
MESSAGES_SHOWN = 50
"""Signals, updates and timers shown on a run's page: the latest, with the count of all."""


# -- the admin ----------------------------------------------------------------------------


class WorkflowRunAdmin(RunActionsAdmin):  # the lifecycle actions and buttons: see .actions
    """Workflow runs: list, filter, search and inspect. Nothing here changes a run (the
    actions and object tools that do go through the runtime; see issue 13)."""

    list_display = (
        "status_badge",
        "workflow_name",
        "workflow_id",
        "created",
        "duration",
        "attempt",
        "waits_on",
    )
    list_display_links = ("workflow_id",)
    list_filter = (
        "status",
        KindFilter,
        WorkflowNameFilter,
        "failure_category",
        ("created_at", admin.DateFieldListFilter),
        HasParentFilter,
        OverdueFilter,
        FinishedFilter,
        FlowControlFilter,
        ConcurrencyKeyFilter,
    )
    # The search is ours (get_search_results); a non-empty search_fields shows the box.
    search_fields = ("workflow_id",)
    search_help_text = (
        "A run id, a workflow id (exact), or attr=value on search attributes; "
        "several terms separated by spaces must all match."
    )
    ordering = ("-created_at", "id")
    # Sorting by another column would sort the whole (filtered) table on every page view.
    sortable_by = ("created",)
    list_per_page = 50
    list_max_show_all = 200
    paginator = LookAheadPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts are COUNT queries per filter choice
    actions = RUN_ACTIONS  # cancel, suspend, resume, retry: see .actions
    date_hierarchy = None
    change_form_template = "admin/django_weft/workflowrun/change_form.html"
    fieldsets = (
        (None, {"fields": ("run_id", "status_badge", "workflow_name", "workflow_version", "workflow_id")}),
        (
            "Progress",
            {
                "fields": (
                    "created",
                    "updated",
                    "finished",
                    "duration",
                    "attempt",
                    "priority",
                    "flow_control",
                    "waits_on",
                    "waiting_on_json",
                    "cancellation_request",
                    "ready",
                    "deadline",
                )
            },
        ),
        ("Input and outcome", {"fields": ("args_json", "kwargs_json", "result_json", "error_json")}),
        (
            "Ownership",
            {"fields": ("owner_id", "owner_epoch", "lease_expires", "claimed"), "classes": ["collapse"]},
        ),
        (
            "Family",
            {
                "fields": (
                    "parent_link",
                    "children_links",
                    "reset_from_link",
                    "reset_to_link",
                    "schedule_link",
                )
            },
        ),
        ("Search attributes", {"fields": ("search_attributes_json",)}),
    )
    # Every field shown is read-only: a run changes only through the runtime.
    readonly_fields = tuple(str(name) for _, options in fieldsets for name in options["fields"])

    class Media:
        css = {"all": ("django_weft/admin.css",)}
        js = ("django_weft/run_page.js",)

    # -- permissions: read-only ---------------------------------------------------------

    def has_view_permission(self, request: HttpRequest, obj: WorkflowRun | None = None) -> bool:
        # The catalogue's "view" (view_workflowrun), as the REST API asks: Django's
        # default would let change_workflowrun show runs too, and a run cannot be
        # changed here.
        return OPERATIONS["view"].allowed(request.user)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # runs are started through the runtime: the Start workflow tool

    def has_change_permission(self, request: HttpRequest, obj: WorkflowRun | None = None) -> bool:
        return False  # a run changes only by its worker or a lifecycle call

    def has_delete_permission(self, request: HttpRequest, obj: WorkflowRun | None = None) -> bool:
        return False  # retention removes finished runs

    # -- extra pages: the object tools (tools.py) and the dashboard (dashboard.py) ------

    def get_urls(self) -> list[URLPattern]:
        return [*tool_urls(self), *reset_urls(self), *dashboard_urls(self), *super().get_urls()]

    # -- changelist ---------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowRun]:
        return runtime.run_queryset(may_lag=reads_may_lag(request))

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RunChangeList

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: Any,
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> Paginator:
        try:
            page_number = int(request.GET.get(PAGE_VAR, 1))
        except ValueError:
            page_number = 1
        # The page number too: the look-ahead starts from it.
        return self.paginator(queryset, per_page, orphans, allow_empty_first_page, page_number=page_number)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[WorkflowRun], search_term: str
    ) -> tuple[QuerySet[WorkflowRun], bool]:
        """Each term narrows the list: a run id or workflow id matches exactly (both are
        indexed), ``attr=value`` matches a search attribute (the GIN index on PostgreSQL)."""
        if not search_term.strip():
            return queryset, False
        try:
            search = parse_run_search(search_term)
        except SearchError as exc:
            self.message_user(request, str(exc), messages.WARNING)
            return queryset.none(), False
        for term in search.ids:
            run_id = as_run_id(term)
            wanted = Q(workflow_id=term) if run_id is None else Q(pk=run_id) | Q(workflow_id=term)
            queryset = queryset.filter(wanted)
        for name, raw in search.attributes:
            queryset = queryset.search_attribute(name, raw)  # type: ignore[attr-defined]
        return queryset, False

    # -- columns and fields -------------------------------------------------------------

    @admin.display(description="status", ordering="status")
    def status_badge(self, run: WorkflowRun) -> SafeString:
        return status_badge(run.status)

    created = moment_field("created_at", "created")
    updated = moment_field("updated_at", "updated")
    finished = moment_field("finished_at", "finished")
    ready = moment_field("ready_at", "runnable since")
    deadline = moment_field("execution_deadline", "execution deadline")
    lease_expires = moment_field("lease_expires_at", "lease expires at")
    claimed = moment_field("claimed_at", "claimed at")

    @admin.display(description="run id")
    def run_id(self, run: WorkflowRun) -> str:
        return str(run.pk)

    @admin.display(description="duration")
    def duration(self, run: WorkflowRun) -> str:
        if run.finished_at is not None:
            return timeline.format_duration(run.finished_at - run.created_at)
        if run.status in TERMINAL_STATUSES:
            return "-"
        if run.status == RunStatus.PENDING:
            return "not started"
        return f"running for {timeline.format_duration(timezone.now() - run.created_at)}"

    @admin.display(description="waits on")
    def waits_on(self, run: WorkflowRun) -> str:
        if not run.waiting_on:
            return ""
        steps = getattr(run, "weft_waited_steps", None)
        if steps is None:  # the detail page: one run, read its waited steps here
            seqs = waited_positions(run.waiting_on)
            found = runtime.read_steps_at({str(run.pk): seqs}, same_database_as=run) if seqs else {}
            steps = found.get(str(run.pk), {})
        return describe_wait(
            run.waiting_on,
            steps=steps,
            queue_of=queue_of,
            tz=timezone.get_current_timezone(),
            today=timezone.now(),
        )

    @admin.display(description="concurrency")
    def flow_control(self, run: WorkflowRun) -> str:
        return slot_words(runtime.run_slot(run))

    @admin.display(description="waiting on (as recorded)")
    def waiting_on_json(self, run: WorkflowRun) -> SafeString | str:
        return pretty_json(run.waiting_on) if run.waiting_on else "-"

    @admin.display(description="cancellation request")
    def cancellation_request(self, run: WorkflowRun) -> str:
        request = CancelRequest.of(run.cancel_request)
        if request is None:
            return "-"
        sent = f"requested {request.requested_at}"
        if request.from_parent:
            sent += " (its parent's close policy)"
        if request.reason:
            sent += f": {request.reason}"
        if request.pending:
            state = "pending (the workflow receives it at its current or next blocking point)"
        else:
            state = f"received at position {request.seq}"
        return f"{sent}; {state}"

    @admin.display(description="args")
    def args_json(self, run: WorkflowRun) -> SafeString:
        return pretty_json(run.args)

    @admin.display(description="kwargs")
    def kwargs_json(self, run: WorkflowRun) -> SafeString:
        return pretty_json(run.kwargs)

    @admin.display(description="result")
    def result_json(self, run: WorkflowRun) -> SafeString | str:
        return pretty_json(run.result) if run.result is not None else "-"

    @admin.display(description="error")
    def error_json(self, run: WorkflowRun) -> SafeString | str:
        if not run.error:
            return "-"
        error = dict(run.error)
        trace = error.pop("traceback", None)
        shown = pretty_json(error)
        if trace:
            text = trace if isinstance(trace, str) else "".join(str(line) for line in trace)
            return format_html('{}<pre class="weft-traceback">{}</pre>', shown, text)
        return shown

    @admin.display(description="search attributes")
    def search_attributes_json(self, run: WorkflowRun) -> SafeString | str:
        return pretty_json(run.search_attributes) if run.search_attributes else "-"

    @admin.display(description="parent run")
    def parent_link(self, run: WorkflowRun) -> SafeString | str:
        if run.parent_id is None:
            return "-"
        parent = runtime.run_queryset(same_database_as=run).filter(pk=run.parent_id)
        found = parent.only("id", "workflow_id", "workflow_name", "status").first()
        if found is None:
            return f"{run.parent_id} (no longer kept)"
        return run_link(found)

    @admin.display(description="started by schedule")
    def schedule_link(self, run: WorkflowRun) -> SafeString | str:
        attributes = run.search_attributes or {}
        schedule_id = attributes.get("weft_schedule_id")
        if not isinstance(schedule_id, str):
            return "-"
        fire = f"the fire of {attributes.get('weft_scheduled_at') or '?'}"
        if not runtime.schedule_queryset(same_database_as=run).filter(pk=schedule_id).exists():
            return f"{schedule_id} (deleted since), {fire}"
        url = admin_url(Schedule, "change", schedule_id, site=self.admin_site.name)
        return format_html('<a href="{}">{}</a>, {}', url, schedule_id, fire)

    @admin.display(description="child runs")
    def children_links(self, run: WorkflowRun) -> SafeString | str:
        children = list(
            runtime.run_queryset(same_database_as=run)
            .filter(parent_id=run.pk)
            .only("id", "workflow_id", "workflow_name", "status", "created_at")
            .order_by("created_at", "id")[: CHILDREN_SHOWN + 1]
        )
        if not children:
            return "-"
        links = format_html_join(
            "", "<li>{}</li>", ((run_link(child),) for child in children[:CHILDREN_SHOWN])
        )
        more = format_html("<li>… more (the first {} shown)</li>", CHILDREN_SHOWN)
        return format_html(
            '<ul class="weft-children">{}{}</ul>', links, more if len(children) > CHILDREN_SHOWN else ""
        )

    @admin.display(description="reset from")
    def reset_from_link(self, run: WorkflowRun) -> SafeString | str:
        return _reset_link(run, run.reset_from, "this run kept its entries before position")

    @admin.display(description="reset to")
    def reset_to_link(self, run: WorkflowRun) -> SafeString | str:
        return _reset_link(run, run.reset_to, "it kept this run's entries before position")

    # -- the detail page ----------------------------------------------------------------

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
            context.update(self.header_context(obj))
            context.update(self.history_context(request, obj))
            context.update(self.messages_context(obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def header_context(self, run: WorkflowRun) -> dict[str, Any]:
        """What the run page shows above its timeline, and the sections below it that
        have something to show: the facts of the run (none empty), its input and outcome as
        foldable JSON, its family, its search attributes, its ownership; whether the page
        refreshes itself (a live run) and how often."""
        live = run.status not in TERMINAL_STATUSES
        slot = runtime.run_slot(run)
        facts = [
            # The workflow and its workflow id are the header's title.
            ("run id", format_html("<code>{}</code>", run.pk)),
            ("version", run.workflow_version),
            ("for", self.related_object_link(run)),
            ("created", zoned_moment(run.created_at)),
            ("finished", zoned_moment(run.finished_at) if run.finished_at else ""),
            ("duration", self.duration(run)),
            ("attempt", str(run.attempt) if run.attempt > 1 else ""),
            ("priority", str(run.priority)),
            ("concurrency", slot_words(slot)),
            # A queued run's reason with the slots in use now, not when it was queued.
            ("waits on", slot.reason if slot is not None and slot.reason else self.waits_on(run)),
            ("cancellation", self.cancellation_request(run) if run.cancel_request else ""),
            ("runnable since", zoned_moment(run.ready_at) if live and run.ready_at else ""),
            ("deadline", zoned_moment(run.execution_deadline) if run.execution_deadline else ""),
        ]
        family = [
            ("parent run", self.parent_link(run) if run.parent_id else ""),
            ("started by schedule", self.schedule_link(run)),
            ("reset from", self.reset_from_link(run)),
            ("reset to", self.reset_to_link(run)),
        ]
        io = [
            json_block(label, value) for label, value in (("args", run.args), ("kwargs", run.kwargs)) if value
        ]
        if run.result is not None:
            io.append(json_block("result", run.result))
        if run.error:
            error = dict(run.error)
            error.pop("traceback", None)
            io.append(
                format_html('<div class="weft-run-error">{}</div>', error_html(run.error, key="run-trace"))
            )
            io.append(json_block("error", error, folded=True))
        return {
            "weft_facts": [(label, value) for label, value in facts if value not in ("", "-", None)],
            "weft_family": [(label, value) for label, value in family if value not in ("", "-", None)],
            "weft_children": self.children_links(run),
            "weft_io": io,
            "weft_search_attributes": (
                json_block("search attributes", run.search_attributes) if run.search_attributes else None
            ),
            "weft_ownership": [
                ("owner", run.owner_id or "-"),
                ("epoch", str(run.owner_epoch)),
                ("claimed at", zoned_moment(run.claimed_at)),
                ("lease expires at", zoned_moment(run.lease_expires_at)),
                ("updated", zoned_moment(run.updated_at)),
            ],
            "weft_status_badge": status_badge(run.status),
            "weft_live": live,
            "weft_refresh_seconds": LIVE_REFRESH_SECONDS.get(str(run.status), 5),
            "weft_zone": timezone.get_current_timezone_name(),
        }

    def related_object_link(self, run: WorkflowRun) -> SafeString | str:
        """The object the run was started for (``related_object``), as a link to its admin
        page on this site when it has one; "" for a run started without one."""
        key = (run.search_attributes or {}).get(RELATED_OBJECT_ATTRIBUTE)
        if not isinstance(key, str) or ":" not in key:
            return ""
        label, _, pk = key.partition(":")
        try:
            model = apps.get_model(label)
        except (LookupError, ValueError):
            return format_html("<code>{}</code> (no such model here)", key)
        found = model._default_manager.filter(pk=pk).first() if pk else None
        if found is None:
            return format_html("{} <code>{}</code> (deleted since)", model._meta.verbose_name, pk)
        # This site's page for it, else another site's (a project may keep its models and
        # the runs on separate admin sites).
        site = next((site for site in (self.admin_site, *all_sites) if site.is_registered(model)), None)
        if site is None:
            return format_html("{} {}", model._meta.verbose_name, found)
        try:
            url = admin_url(model, "change", found.pk, site=site.name)
        except NoReverseMatch:  # a site not in the URL conf
            return format_html("{} {}", model._meta.verbose_name, found)
        return format_html(
            '{} <a href="{}" class="weft-related-object">{}</a>', model._meta.verbose_name, url, found
        )

    def history_context(self, request: HttpRequest, run: WorkflowRun) -> dict[str, Any]:
        """The timeline and a page of the steps table, from the run's history: every step
        without its payloads (the timeline shows none), then the payloads of the page's."""
        entries = runtime.read_history(run, payloads=False)
        pages = max(math.ceil(len(entries) / STEPS_PER_PAGE), 1)
        try:
            page = min(max(int(request.GET.get("steps_page", 1)), 1), pages)
        except ValueError:
            page = 1
        outline = entries[(page - 1) * STEPS_PER_PAGE : page * STEPS_PER_PAGE]
        read = runtime.read_steps_at({str(run.pk): [entry.seq for entry in outline]}, same_database_as=run)
        full = read.get(str(run.pk), {})
        shown = [full.get(entry.seq, entry) for entry in outline]
        # "Reset to here" on each entry, for a user who may reset, unless the run was
        # replaced already (reset, or continued as new). A later start under its workflow
        # id is found by the reset page instead (one query less for every run page).
        may = may_reset(request) and run.reset_to is None and run.status != RunStatus.CONTINUED
        reset_url = admin_url(WorkflowRun, "reset", run.pk) if may else None
        return {
            "weft_failed_attempts": sum(len(entry.failed_attempts or []) for entry in entries),
            "weft_timeline": timeline.render(entries, now=timezone.now(), tz=timezone.get_current_timezone()),
            "weft_steps": steps_rows(shown, reset_url=reset_url),
            "weft_reset_url": reset_url,
            "weft_steps_count": len(entries),
            "weft_steps_page": page,
            "weft_steps_pages": pages,
            "weft_steps_first": (page - 1) * STEPS_PER_PAGE + 1 if entries else 0,
            "weft_steps_last": (page - 1) * STEPS_PER_PAGE + len(shown),
        }

    def messages_context(self, run: WorkflowRun) -> dict[str, Any]:
        """The signals, updates and timers tables: the latest :data:`MESSAGES_SHOWN` of each."""
        signals = runtime.read_signals(run, limit=MESSAGES_SHOWN)
        updates = runtime.read_updates(run, limit=MESSAGES_SHOWN)
        timers = runtime.read_timers(run, limit=MESSAGES_SHOWN)
        return {
            "weft_signals": signals,
            "weft_signals_rows": signals_rows(signals.rows),
            "weft_updates": updates,
            "weft_updates_rows": updates_rows(updates.rows),
            "weft_timers": timers,
            "weft_timers_rows": timers_rows(timers.rows),
        }

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse | TemplateResponse:
        extra = {**(extra_context or {}), "show_save": False, "show_save_and_continue": False}
        show_only(request)  # a run's page changes nothing: its buttons post to the changelist
        return super().changeform_view(request, object_id, form_url, extra)


def slot_words(slot: runtime.RunSlot | None) -> str:
    """A run's key and slot, with its group's slots in use now: "key customer-7, holds a
    slot, 1 of 1 in use"; "" for a run of a workflow without a concurrency limit."""
    if slot is None:
        return ""
    key = f"key {slot.key}" if slot.key else "one limit for the workflow"
    if slot.limit is not None and slot.limit.per_workflow and slot.key:
        key += " (its workflow's slots are shared by all keys)"
    state = {"held": "holds a slot", "queued": "queued for a slot"}.get(slot.slot, "")
    figures = ""
    if slot.limit is None:
        figures = "its workflow is not registered in this process, so its limit is unknown here"
    elif slot.in_use is not None:
        figures = f"{slot.in_use} of {slot.limit.limit} in use"
    return ", ".join(part for part in (key, state, figures) if part)


def _reset_link(run: WorkflowRun, stored: object, how: str) -> SafeString | str:
    """A reset's other run, as a link, with where the history was cut and why."""
    link = ResetLink.of(stored)
    if link is None:
        return "-"
    other = (
        runtime.run_queryset(same_database_as=run)
        .filter(pk=link.run_id)
        .only("id", "workflow_id", "workflow_name", "status")
        .first()
    )
    shown = run_link(other) if other is not None else f"{link.run_id} (no longer kept)"
    return format_html("{}: {} {} ({}, {})", shown, how, link.seq, link.reason, link.reset_at)


__all__ = ["CHILDREN_SHOWN", "LIVE_REFRESH_SECONDS", "MESSAGES_SHOWN", "STEPS_PER_PAGE", "WorkflowRunAdmin"]
