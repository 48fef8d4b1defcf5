"""Where a bulk job finds its runs: run sources, looked up by name.

A bulk job stores its filter (JSON, as its caller gave it) and the name of a run source
(``BulkJob.runs_from``): a function ``(job) -> WorkflowRun queryset`` registered here.
Each batch the tick reads looks the name up in this registry. Nothing named in a row is
imported, so the tick runs no surface code, and a renamed module cannot strand a job.

Two sources are built in:

- ``"lookups"`` (:data:`LOOKUPS`), the default of
  :func:`~django_weft.runtime.bulk_jobs.start_bulk_job`: the filter taken as ORM lookups
  of ``WorkflowRun`` (:func:`runs_by_lookups`).
- ``"runs_list"`` (:data:`RUNS_LIST`), the jobs ``POST runs/bulk/`` starts: the filter
  in the terms of the REST list ``GET runs/`` (``status``, ``workflow``,
  ``workflow_id``, ``parent``, ``created_after``, ``created_before``,
  ``concurrency_key``, ``kind``, ``queued``, ``search.<attr>``), evaluated here
  (:func:`runs_listed`), on the runs the job's creator may see (:func:`runs_seen_by`).
  It selects the runs the list shows for the same filter.

A project adds its own with :func:`register_run_source`, from a module every process
imports (its ``workflows`` module, say): a job naming a source the tick's process does
not know fails with the error.

``WEFT_API_RUN_FILTER`` takes a request, and the tick has none. :func:`runs_seen_by`
applies it to a stand-in request (:func:`stand_in_request`) whose ``user`` is the job's
creator, loaded again (a removed or deactivated user fails the job); the REST route
checks, before it stores a job, that the stand-in gives exactly the runs its request
gives, and refuses the job otherwise (a run filter that reads a header or the session
cannot be applied later).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from django import forms
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.http import HttpRequest, QueryDict
from django.utils.module_loading import import_string

from ..conf import weft_settings
from ..engine.errors import ConfigurationError, InvalidInput
from ..engine.records import RunStatus
from ..models import BulkJob, WorkflowRun
from ..models.querysets import WorkflowRunQuerySet

RunSource = Callable[[BulkJob], QuerySet[WorkflowRun]]

LOOKUPS = "lookups"
"""The run source that takes a job's filter as ORM lookups (:func:`runs_by_lookups`)."""
RUNS_LIST = "runs_list"
"""The run source of the jobs ``POST runs/bulk/`` starts (:func:`runs_of_list_filter`)."""
NAME_MAX_LENGTH = BulkJob._meta.get_field("runs_from").max_length or 200

SEARCH_PREFIX = "search."
"""The list's filters on search attributes: ``search.<attr>=<value>``."""

_sources: dict[str, RunSource] = {}


def register_run_source(name: str, source: RunSource) -> None:
    """Register ``source``, a function ``(job) -> WorkflowRun queryset``, under ``name``:
    a bulk job started with ``runs_from=name`` reads its runs through it, in whichever
    process works on the job, so register it from a module every process imports.

    Registering the same function again is a no-op; another function under a taken name
    is a ``ConfigurationError``, and so is a name that is not a non-empty string of at
    most 200 characters or a source that is not callable."""
    if not isinstance(name, str) or not name or len(name) > NAME_MAX_LENGTH:
        raise ConfigurationError(
            f"a run source's name is a non-empty string of at most {NAME_MAX_LENGTH} characters; got {name!r}"
        )
    if not callable(source):
        raise ConfigurationError(f"run source {name!r} is not a function (job) -> WorkflowRun queryset")
    registered = _sources.get(name)
    if registered is not None and registered is not source:
        raise ConfigurationError(
            f"a run source named {name!r} is registered already ({registered!r}); choose another name"
        )
    _sources[name] = source


def run_source(name: str) -> RunSource:
    """The run source registered under ``name``, or ``InvalidInput`` saying which exist."""
    source = _sources.get(name) if isinstance(name, str) else None
    if source is None:
        raise InvalidInput(
            f"no run source named {name!r}: use one of {', '.join(sorted(_sources))}, or register "
            "yours with django_weft.runtime.register_run_source in every process"
        )
    return source


def runs_by_lookups(job: BulkJob) -> QuerySet[WorkflowRun]:
    """The runs whose fields match ``job.filter`` taken as ORM lookups of ``WorkflowRun``,
    e.g. ``{"workflow_name": "orders.fulfil", "status__in": ["waiting"],
    "search_attributes__customer": 7}``: the :data:`LOOKUPS` source."""
    return WorkflowRun.objects.using(weft_settings.DATABASE_ALIAS).filter(**(job.filter or {}))


def runs_of_list_filter(job: BulkJob) -> WorkflowRunQuerySet:
    """The :data:`RUNS_LIST` source: the list's filters (the job's filter) on the runs its
    creator may see."""
    return runs_listed(runs_seen_by(job.created_by), job.filter)


# -- the list's filters ---------------------------------------------------------------------


class InUTC(forms.DateTimeField):
    """A date-time field whose value is converted to UTC: an offset the database cannot
    take (such as ``-20:57``, which Python accepts and PostgreSQL does not) or a time out
    of range is refused as invalid input. The REST list's filter field builds on it too."""

    def to_python(self, value: Any) -> datetime | None:
        parsed = super().to_python(value)
        if parsed is None:
            return None
        try:
            return parsed.astimezone(UTC)
        except (OverflowError, ValueError):
            raise forms.ValidationError("This date-time is out of range.") from None


class StrictBooleanField(forms.Field):
    """``true``/``false`` (or ``1``/``0``); anything else is an error, not "no filter". The
    REST list's boolean filters use it too."""

    def to_python(self, value: Any) -> bool | None:
        if value in (None, ""):
            return None
        lowered = str(value).lower()
        if lowered in ("true", "1"):
            return True
        if lowered in ("false", "0"):
            return False
        raise forms.ValidationError("Give true or false.")


class _IsoDateTimeField(InUTC):
    """An ISO 8601 date-time only (no locale formats), in UTC."""

    input_formats: list[str] = []  # to_python parses ISO 8601 itself, before any format


class _ListFilters(forms.Form):
    """The list's filters other than ``search.<attr>``, read from a query string's values
    as ``GET runs/`` reads them (the last value of a repeated single-valued one)."""

    status = forms.MultipleChoiceField(
        required=False, choices=[(status.value, status.value) for status in RunStatus]
    )
    workflow = forms.CharField(required=False)
    workflow_id = forms.CharField(required=False)
    parent = forms.UUIDField(required=False)
    created_after = _IsoDateTimeField(required=False)
    created_before = _IsoDateTimeField(required=False)
    concurrency_key = forms.CharField(required=False)
    kind = forms.ChoiceField(required=False, choices=[("task", "task"), ("workflow", "workflow")])
    queued = StrictBooleanField(required=False)


LIST_FILTERS = tuple(_ListFilters.base_fields)
"""The names of the list's filters (besides ``search.<attr>``)."""

_LOOKUPS = {
    "workflow": "workflow_name",
    "workflow_id": "workflow_id",
    "parent": "parent_id",
    "created_after": "created_at__gte",
    "created_before": "created_at__lt",
    "concurrency_key": "concurrency_key",
}


def list_filter_params(spec: Mapping[str, Any]) -> QueryDict:
    """A stored list filter (``{"status": ["waiting", "failed"], "search.customer": ["7"]}``;
    a single value may stand for a list of one) as the query string of ``GET runs/``."""
    if not isinstance(spec, Mapping):
        raise InvalidInput("the job's filter is not an object", field="filter")
    params = QueryDict(mutable=True)
    for key, value in spec.items():
        values = value if isinstance(value, list) else [value]
        params.setlist(str(key), [str(item) for item in values])
    return params


def runs_listed(runs: WorkflowRunQuerySet, spec: Mapping[str, Any]) -> WorkflowRunQuerySet:
    """``runs`` narrowed by ``spec``, a filter in the terms of ``GET runs/`` (see
    :func:`list_filter_params`), as the list narrows them. Raises ``InvalidInput``
    (``field="filter"``) for an unknown filter or a value it cannot take."""
    params = list_filter_params(spec)
    unknown = sorted(key for key in params if key not in LIST_FILTERS and not key.startswith(SEARCH_PREFIX))
    if unknown:
        raise InvalidInput(
            f"unknown filter {', '.join(unknown)}: use {', '.join(LIST_FILTERS)} or search.<attr>",
            field="filter",
        )
    form = _ListFilters(params)
    if not form.is_valid():
        problems = "; ".join(f"{key}: {' '.join(map(str, errors))}" for key, errors in form.errors.items())
        raise InvalidInput(f"the filter cannot be applied: {problems}", field="filter")
    values = form.cleaned_data
    if values["status"]:
        runs = runs.filter(status__in=values["status"])
    for name, lookup in _LOOKUPS.items():
        if values[name] not in (None, ""):
            runs = runs.filter(**{lookup: values[name]})
    if values["kind"]:
        runs = runs.of_kind(values["kind"])
    if values["queued"] is not None:
        runs = runs.queued_for_slot() if values["queued"] else runs.not_queued_for_slot()
    for key in params:
        if key.startswith(SEARCH_PREFIX):
            for raw in params.getlist(key):
                try:
                    runs = runs.search_attribute(key[len(SEARCH_PREFIX) :], raw)
                except InvalidInput as exc:
                    problem = f"the filter cannot be applied: {key}: {exc.message}"
                    raise InvalidInput(problem, field="filter") from None
    return runs


# -- WEFT_API_RUN_FILTER without a request ---------------------------------------------------


@lru_cache(maxsize=4)
def run_filter(path: str) -> Callable[[Any, WorkflowRunQuerySet], WorkflowRunQuerySet]:
    """The function ``WEFT_API_RUN_FILTER`` (a setting) names."""
    return import_string(path)


def stand_in_request(username: str) -> Any:
    """A request from ``username`` and nothing else, for ``WEFT_API_RUN_FILTER`` where no
    request exists (the tick). It carries ``weft_bulk_stand_in = True``."""
    users = get_user_model()._default_manager
    try:
        user = users.get_by_natural_key(username)
    except get_user_model().DoesNotExist:
        raise InvalidInput(
            f"the user who started this bulk job, {username!r}, no longer exists; "
            "the runs it may act on cannot be known"
        ) from None
    if not user.is_active:
        raise InvalidInput(f"the user who started this bulk job, {username!r}, is no longer active")
    http = HttpRequest()
    http.method = "POST"
    request: Any = http
    try:
        # The run filter is written for the REST API's requests, which are DRF's; DRF is
        # installed wherever the API is (it is the API's optional dependency).
        from rest_framework.request import Request
    except ImportError:  # pragma: no cover - no API, so no job of the list's filters
        pass
    else:
        request = Request(http)
    request.user = user
    request.weft_bulk_stand_in = True
    return request


def runs_seen_by(username: str) -> WorkflowRunQuerySet:
    """The runs ``username`` may see through the REST API, as the tick can tell."""
    runs: WorkflowRunQuerySet = WorkflowRun.objects.using(weft_settings.DATABASE_ALIAS).all()
    path = weft_settings.API_RUN_FILTER
    if path is None:
        return runs
    return run_filter(path)(stand_in_request(username), runs)


register_run_source(LOOKUPS, runs_by_lookups)
register_run_source(RUNS_LIST, runs_of_list_filter)
