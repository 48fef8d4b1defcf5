"""The run changelist's parts: a paginator that never counts the table, a changelist
reading only the listed columns, and the list filters (the dashboard links to some of them).
"""

from __future__ import annotations

from datetime import timedelta
from functools import cached_property
from typing import Any, ClassVar

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest

from ... import runtime
from ...engine.records import TERMINAL_STATUSES
from ...engine.registry import registry
from ...models import Timer, WorkflowRun
from ..common.reads import reads_may_lag
from .waits import waited_positions

LIST_COLUMNS = (
    "id",
    "workflow_id",
    "workflow_name",
    "status",
    "attempt",
    "waiting_on",
    "created_at",
    "finished_at",
)
"""The columns the changelist reads: JSON payloads and ownership stay in the database."""

# -- the changelist's paginator ---------------------------------------------------------


class LookAheadPaginator(Paginator):
    """A paginator that never counts the table.

    ``count`` is the rows before the requested page plus the rows found by reading up to
    :attr:`look_ahead_pages` pages ahead of it: one ``SELECT id ... LIMIT/OFFSET`` on the
    changelist's indexed order, whose cost grows with the page number, not with the table.
    ``more`` says the list goes on past what was read. On PostgreSQL, an unfiltered list
    also carries :attr:`estimated_total`, the planner's row estimate (``pg_class.reltuples``),
    which is free and good enough to say "about 1.2 million runs".
    """

    look_ahead_pages = 5
    max_page = 10_000
    """Deeper pages are not served (their ``OFFSET`` reads every row before them): the
    admin says the page does not exist; a filter or a search narrows the list instead."""

    def __init__(self, object_list: Any, per_page: int, *args: Any, page_number: int = 1, **kwargs: Any):
        super().__init__(object_list, per_page, *args, **kwargs)
        self.queryset: QuerySet[WorkflowRun] = object_list
        self.page_number = max(page_number, 1)
        self.more = False

    @cached_property
    def count(self) -> int:
        if self.page_number > self.max_page:
            # More than a page, so the admin pages, and finds no such page: no query.
            return self.per_page + 1
        start = (self.page_number - 1) * self.per_page
        limit = self.per_page * self.look_ahead_pages + 1
        found = len(self.queryset.values_list("pk", flat=True)[start : start + limit])
        self.more = found == limit
        return start + found

    @cached_property
    def estimated_total(self) -> int | None:
        queryset = self.queryset
        if queryset.query.where or connections[queryset.db].vendor != "postgresql":
            return None
        with connections[queryset.db].cursor() as cursor:
            cursor.execute(
                "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                [WorkflowRun._meta.db_table],
            )
            row = cursor.fetchone()
        # -1 (never analysed) or 0 says nothing useful.
        return int(row[0]) if row and row[0] and row[0] > 0 else None


class RunChangeList(ChangeList):
    """The changelist reading only :data:`LIST_COLUMNS`, and, for the page's parked runs,
    the steps they wait on (one query for the page)."""

    def get_queryset(self, request: HttpRequest, *args: Any, **kwargs: Any) -> QuerySet[WorkflowRun]:
        return super().get_queryset(request, *args, **kwargs).only(*LIST_COLUMNS)

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        runs = list(self.result_list)
        positions = {str(run.pk): waited_positions(run.waiting_on) for run in runs if run.waiting_on}
        wanted = {key: seqs for key, seqs in positions.items() if seqs}
        waited = runtime.read_steps_at(wanted, may_lag=reads_may_lag(request))
        for run in runs:
            run.weft_waited_steps = waited.get(str(run.pk), {})
        self.result_list = runs


def queue_of(activity_name: str) -> str | None:
    """The queue a registered activity runs on, for the "waits on" column (and the dashboard)."""
    definition = registry.activities.get(activity_name)
    return definition.queue if definition is not None else None


# -- filters ------------------------------------------------------------------------------


class WorkflowNameFilter(admin.SimpleListFilter):
    """The registered workflows' names (from the registry: no DISTINCT over the table)."""

    title = "workflow"
    parameter_name = "workflow"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted(registry.workflows)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
        value = self.value()
        return queryset.filter(workflow_name=value) if value else queryset


class KindFilter(admin.SimpleListFilter):
    """Tasks of Django's task framework (run by ``WeftTaskBackend``) or workflows, by the
    registered names of each (the workflow name index; no scan of search attributes).
    Shown once a task is registered."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        if not registry.workflow_names_of_kind("task"):
            return []
        return [("task", "tasks"), ("workflow", "workflows")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
        value = self.value()
        if value in ("task", "workflow"):
            return queryset.of_kind(value)  # type: ignore[attr-defined]
        return queryset


class HasParentFilter(admin.SimpleListFilter):
    """Child runs (started by another run) or top-level runs."""

    title = "parent"
    parameter_name = "has_parent"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "child runs"), ("no", "top-level runs")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
        if self.value() == "yes":
            return queryset.filter(parent__isnull=False)
        if self.value() == "no":
            return queryset.filter(parent__isnull=True)
        return queryset


# -- filters the dashboard links to ---------------------------------------------------------


class FlowControlFilter(admin.SimpleListFilter):
    """Runs by their place under a concurrency limit: queued for a slot, holding one, or
    of a workflow without a limit. The first two read the partial indexes of flow control
    (``weft_run_flow_queue``, ``weft_run_flow_live``)."""

    title = "flow control"
    parameter_name = "flow"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("queued", "queued for a slot"), ("holding", "holding a slot"), ("none", "no limit")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
        if self.value() == "queued":
            return queryset.queued_for_slot()  # type: ignore[attr-defined]
        if self.value() == "holding":
            return queryset.holding_slot()  # type: ignore[attr-defined]
        if self.value() == "none":
            return queryset.filter(concurrency_key__isnull=True)
        return queryset


class ConcurrencyKeyFilter(admin.SimpleListFilter):
    """Runs counted under one concurrency key, given in the address
    (``?concurrency_key=customer-7``, as the dashboard's busiest keys link to it), whatever
    their status. Shown once a key is chosen, to clear it: offering keys would take a
    grouped query over the runs on every page view, and the list groups and counts nothing."""

    title = "concurrency key"
    parameter_name = "concurrency_key"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        chosen = self.value()
        return [(chosen, chosen)] if chosen else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
        value = self.value()
        return queryset.filter(concurrency_key=value) if value else queryset


class OverdueFilter(admin.SimpleListFilter):
    """What the sweep has yet to pick up: owned runs whose lease has expired (their worker
    died or stalled), and runs with a timer past its fire time that has not fired. Each
    reads a partial index (owned leases, unfired timers), on the database clock."""

    title = "overdue"
    parameter_name = "overdue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("lease", "lease expired"), ("timer", "timer due")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
        if self.value() == "lease":
            return queryset.expired_leases(Now(), 0)  # type: ignore[attr-defined]
        if self.value() == "timer":
            # No alias of its own: a subquery runs on the database of the list it filters.
            due = Timer.objects.due(Now()).values("run_id")
            return queryset.filter(pk__in=due)
        return queryset


class FinishedFilter(admin.SimpleListFilter):
    """Runs that finished recently. Terminal runs are found by ``updated_at`` (the partial
    index ``weft_run_terminal_updated``; a run's ``updated_at`` is never before its
    ``finished_at``), then checked on ``finished_at``."""

    title = "finished"
    parameter_name = "finished"
    windows: ClassVar[dict[str, tuple[timedelta, str]]] = {
        "10m": (timedelta(minutes=10), "in the last 10 minutes"),
        "1h": (timedelta(hours=1), "in the last hour"),
        "24h": (timedelta(hours=24), "in the last 24 hours"),
    }

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(key, label) for key, (_, label) in self.windows.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
        window = self.windows.get(self.value() or "")
        if window is None:
            return queryset
        since = Now() - window[0]
        return queryset.filter(
            status__in=sorted(TERMINAL_STATUSES), updated_at__gte=since, finished_at__gte=since
        )


__all__ = [
    "LIST_COLUMNS",
    "ConcurrencyKeyFilter",
    "FinishedFilter",
    "FlowControlFilter",
    "HasParentFilter",
    "LookAheadPaginator",
    "OverdueFilter",
    "RunChangeList",
    "WorkflowNameFilter",
    "queue_of",
]
