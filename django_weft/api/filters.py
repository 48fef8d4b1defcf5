"""Which runs a request may see (``WEFT_API_RUN_FILTER``); the filters of ``GET runs/``
(django-filter), plus ``search.<attr>=<value>`` on search attributes, which ``POST
runs/bulk/`` applies too; and those of ``GET schedules/``."""

from __future__ import annotations

from typing import Any

import django_filters
from django.http import QueryDict
from django_filters.fields import IsoDateTimeField
from rest_framework import exceptions
from rest_framework.filters import BaseFilterBackend
from rest_framework.request import Request

from .. import runtime
from ..conf import weft_settings
from ..engine.errors import InvalidInput
from ..engine.records import RunStatus
from ..models import Schedule, WorkflowRun
from ..models.querysets import WorkflowRunQuerySet
from ..runtime.run_sources import InUTC, StrictBooleanField, run_filter

SEARCH_PREFIX = "search."


class UTCIsoDateTimeField(InUTC, IsoDateTimeField):
    """An ISO 8601 date-time (django-filter's parsing), converted to UTC as the runtime's
    list filters convert it (:class:`~django_weft.runtime.run_sources.InUTC`)."""


class UTCIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UTCIsoDateTimeField


class StrictBooleanFilter(django_filters.BooleanFilter):
    field_class = StrictBooleanField


class RunFilter(django_filters.FilterSet):
    status = django_filters.MultipleChoiceFilter(
        distinct=False,  # one row per run anyway; DISTINCT would sort every matching row
        choices=[(status.value, status.value) for status in RunStatus],
        help_text="Runs in any of these statuses (repeat the parameter for several).",
    )
    workflow = django_filters.CharFilter(field_name="workflow_name", help_text="Registered workflow name.")
    workflow_id = django_filters.CharFilter(help_text="Business key: every run with this workflow id.")
    parent = django_filters.UUIDFilter(field_name="parent_id", help_text="Children of this run id.")
    created_after = UTCIsoDateTimeFilter(
        field_name="created_at", lookup_expr="gte", help_text="Created at or after (ISO 8601)."
    )
    created_before = UTCIsoDateTimeFilter(
        field_name="created_at", lookup_expr="lt", help_text="Created before (ISO 8601)."
    )
    concurrency_key = django_filters.CharFilter(
        help_text="Runs counted under this concurrency key (exact), whatever their status."
    )
    kind = django_filters.ChoiceFilter(
        choices=[("task", "task"), ("workflow", "workflow")],
        method="filter_kind",
        help_text="Tasks of Django's task framework (run by WeftTaskBackend; their workflow is the "
        "task's module path) or workflows.",
    )
    queued = StrictBooleanFilter(
        method="filter_queued",
        help_text="Runs queued for a concurrency slot (true: pending, waiting for a slot) or all "
        "the others (false).",
    )

    class Meta:
        model = WorkflowRun
        fields = (
            "status",
            "workflow",
            "workflow_id",
            "parent",
            "created_after",
            "created_before",
            "concurrency_key",
            "kind",
            "queued",
        )

    def filter_kind(self, queryset: WorkflowRunQuerySet, name: str, value: str | None) -> WorkflowRunQuerySet:
        return queryset.of_kind(value) if value else queryset

    def filter_queued(
        self, queryset: WorkflowRunQuerySet, name: str, value: bool | None
    ) -> WorkflowRunQuerySet:
        if value is None:
            return queryset
        return queryset.queued_for_slot() if value else queryset.not_queued_for_slot()


class ScheduleFilter(django_filters.FilterSet):
    paused = StrictBooleanFilter(help_text="Paused (true) or firing (false) schedules.")
    workflow = django_filters.CharFilter(field_name="workflow_name", help_text="Registered workflow name.")
    managed = StrictBooleanFilter(help_text="Declared in code (true) or made by hand (false) schedules.")

    class Meta:
        model = Schedule
        fields = ("paused", "workflow", "managed")


class SearchAttributeFilter(BaseFilterBackend):
    """``search.<attr>=<value>``: runs whose search attributes hold that value (JSON
    containment on PostgreSQL, using the GIN index; key by key on SQLite)."""

    def filter_queryset(
        self, request: Request, queryset: WorkflowRunQuerySet, view: Any
    ) -> WorkflowRunQuerySet:
        return filter_by_search_attributes(queryset, request.query_params)


def visible_runs(request: Request, *, may_lag: bool = False) -> WorkflowRunQuerySet:
    """The runs this request may see at all: ``WEFT_API_RUN_FILTER`` applied. On the
    primary database, or with ``may_lag`` (a route that only shows runs) on
    ``WEFT_READ_DATABASE``."""
    runs = runtime.run_queryset(may_lag=may_lag)
    path = weft_settings.API_RUN_FILTER
    if path is None:
        return runs
    return run_filter(path)(request, runs)


def filter_by_search_attributes(queryset: WorkflowRunQuerySet, params: QueryDict) -> WorkflowRunQuerySet:
    """The ``search.<attr>`` parameters of ``params`` applied to ``queryset``; a bad name or
    value is a DRF ``ValidationError`` naming the parameter."""
    for key in params:
        if not key.startswith(SEARCH_PREFIX):
            continue
        attribute = key[len(SEARCH_PREFIX) :]
        for raw in params.getlist(key):
            try:
                queryset = queryset.search_attribute(attribute, raw)
            except InvalidInput as exc:
                raise exceptions.ValidationError({key: exc.message}) from None
    return queryset


def filter_runs(queryset: WorkflowRunQuerySet, params: QueryDict) -> WorkflowRunQuerySet:
    """``params`` (a query string's parameters) applied as ``GET runs/`` applies them:
    :class:`RunFilter`, then ``search.<attr>``. A parameter that is neither is refused,
    and so is a bad value, as a DRF ``ValidationError`` naming the parameter. ``POST
    runs/bulk/`` checks and counts its filter with this; the job it stores is read by
    the runtime's ``"runs_list"`` run source, which selects the same runs."""
    known = set(RunFilter.base_filters)
    unknown = {
        key: [f"Unknown filter; use {', '.join(RunFilter.Meta.fields)} or search.<attr>."]
        for key in params
        if key not in known and not key.startswith(SEARCH_PREFIX)
    }
    if unknown:
        raise exceptions.ValidationError(unknown)
    filterset = RunFilter(params, queryset=queryset)
    if not filterset.is_valid():
        raise exceptions.ValidationError(
            {key: [str(error) for error in errors] for key, errors in filterset.errors.items()}
        )
    return filter_by_search_attributes(filterset.qs, params)
