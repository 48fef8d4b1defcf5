"""Which runs a bulk job started by ``POST runs/bulk/`` acts on.

The job stores the filter in the list's terms (query-string values: lists of strings)
and names :func:`runs_of_job` as its ``runs_from``, so each batch the tick reads applies
``GET runs/``'s own filters (:func:`~.filters.filter_runs`) to the runs the job's
creator may see: the runs the list shows for the same filter, created up to the job's
start.

``WEFT_API_RUN_FILTER`` takes a request, and the tick has none. The job applies it to a
stand-in request (:func:`stand_in_request`) whose ``user`` is the job's creator, loaded
again (a removed or deactivated user fails the job); the route checks, before it stores
the job, that the stand-in gives exactly the runs the real request gives, and refuses
the job otherwise (a run filter that reads a header or the session cannot be applied
later).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.contrib.auth import get_user_model
from django.http import HttpRequest, QueryDict
from rest_framework.request import Request

from ..conf import weft_settings
from ..engine.errors import InvalidInput
from ..models import BulkJob, WorkflowRun
from ..models.querysets import WorkflowRunQuerySet
from .filters import filter_runs, run_filter

RUNS_FROM = "django_weft.api.bulk.runs_of_job"
"""The ``runs_from`` of the jobs this API starts."""


def params_of(spec: Mapping[str, Sequence[str]]) -> QueryDict:
    """A bulk filter (``{"status": ["waiting", "failed"], "search.customer": ["7"]}``) as
    the query string of ``GET runs/`` with the same filter."""
    params = QueryDict(mutable=True)
    for key, values in spec.items():
        params.setlist(key, [str(value) for value in values])
    return params


def stand_in_request(username: str) -> Request:
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
    request = Request(http)
    request.user = user
    request.weft_bulk_stand_in = True
    return request


def runs_seen_by(username: str) -> WorkflowRunQuerySet:
    """The runs ``username`` may see through the API, as the tick can tell."""
    runs: WorkflowRunQuerySet = WorkflowRun.objects.using(weft_settings.DATABASE_ALIAS).all()
    path = weft_settings.API_RUN_FILTER
    if path is None:
        return runs
    return run_filter(path)(stand_in_request(username), runs)


def runs_of_job(job: BulkJob) -> WorkflowRunQuerySet:
    """``runs_from`` of the jobs the API starts: the list's filters (the job's filter) on
    the runs its creator may see."""
    return filter_runs(runs_seen_by(job.created_by), params_of(_spec(job.filter)))


def _spec(stored: Any) -> dict[str, list[str]]:
    if not isinstance(stored, dict):
        raise InvalidInput("the job's filter is not an object", field="filter")
    return {str(key): value if isinstance(value, list) else [value] for key, value in stored.items()}
