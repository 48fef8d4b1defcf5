"""Which runs a request may see (``WEFT_API_RUN_FILTER``); the filters of ``GET runs/``
(django-filter), plus ``search.<attr>=<value>`` on search attributes, which ``POST
runs/bulk/`` applies too; and those of ``GET schedules/``."""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django.http import QueryDict
from django_filters.fields import IsoDateTimeField
from rest_framework import exceptions
from rest_framework.filters import BaseFilterBackend
from rest_framework.request import Request

from ..conf import weft_settings
from ..engine.errors import InvalidInput
from ..engine.records import RunStatus
from ..models import Schedule, WorkflowRun
from ..models.querysets import WorkflowRunQuerySet
from ..runtime.run_sources import InUTC, run_filter

SEARCH_PREFIX = "search."


class UTCIsoDateTimeField(InUTC, IsoDateTimeField):
    """An ISO 8601 date-time (django-filter's parsing), converted to UTC as the runtime's
    list filters convert it (:class:`~django_weft.runtime.run_sources.InUTC`)."""


class UTCIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UTCIsoDateTimeField


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

    class Meta:
        model = WorkflowRun
        fields = ("status", "workflow", "workflow_id", "parent", "created_after", "created_before")


class StrictBooleanField(forms.Field):
    """``true``/``false`` (or ``1``/``0``); anything else is an error, not "no filter"."""

    def to_python(self, value: Any) -> bool | None:
        if value in (None, ""):
            return None
        lowered = str(value).lower()
        if lowered in ("true", "1"):
            return True
        if lowered in ("false", "0"):
            return False
        raise forms.ValidationError("Give true or false.")


class StrictBooleanFilter(django_filters.BooleanFilter):
    field_class = StrictBooleanField


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


def visible_runs(request: Request) -> WorkflowRunQuerySet:
    """The runs this request may see at all: ``WEFT_API_RUN_FILTER`` applied."""
    runs = WorkflowRun.objects.using(weft_settings.DATABASE_ALIAS).all()
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
