"""``runs/bulk/``: a lifecycle operation on every run a filter matches, as a job the tick
works through (the runtime's bulk jobs); ``runs/bulk/{job_id}/``: its progress."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse
from rest_framework import exceptions, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from ... import runtime
from ...conf import weft_settings
from ...models import WorkflowRun
from ...runtime.run_sources import RUNS_LIST, list_filter_params, runs_listed, runs_seen_by
from .. import serializers as s
from ..filters import filter_runs, visible_runs
from ..schema import document
from .common import JOB_ID, WeftAPIView, error_responses, logger


class BulkRoutes(WeftAPIView, viewsets.GenericViewSet):
    """The bulk routes of ``runs/``, which :class:`~.runs.RunViewSet` serves with the others."""

    @document(
        summary="Apply a lifecycle operation to every run a filter matches",
        description="With dry_run: 200 and the count of runs the filter matches now (the runs "
        "GET runs/ lists for the same filter; one COUNT). Without: 202 and a job, stored; the tick "
        "works through it a batch at a time (runs created after the job started are left alone); "
        "GET its url for progress. Needs view_workflowrun and the action's permission.",
        request=s.BulkRequestSerializer,
        responses={
            200: OpenApiResponse(s.BulkCountSerializer, description="dry_run: the count; nothing changed."),
            202: OpenApiResponse(s.BulkJobStartedSerializer, description="The job; Location names it."),
            **error_responses(),
        },
    )
    @action(detail=False, methods=["post"], url_path="bulk", url_name="bulk")
    def bulk(self, request: Request) -> Response:
        body = s.BulkRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        # The route needs view_workflowrun (checked already); the action needs its own
        # permission too, checked by the same permission classes under the action's name.
        self.weft_action = data["action"]
        self.check_permissions(request)
        try:
            runs = filter_runs(visible_runs(request), list_filter_params(data["filter"]))
        except exceptions.ValidationError as exc:
            raise exceptions.ValidationError({"filter": exc.detail}) from None
        if data["dry_run"]:
            return Response({"count": runtime.count_runs(runs)})
        username = request.user.get_username() if request.user.is_authenticated else ""
        if weft_settings.API_RUN_FILTER is not None:
            _check_the_tick_sees_the_same_runs(runs, username, data["filter"])
        job = runtime.start_bulk_job(
            data["action"],
            data["filter"],
            reason=data.get("reason") or None,
            user=username,
            runs_from=RUNS_LIST,
        )
        shaped = self._job_shape(job)
        return Response(
            {"job": shaped, "url": shaped["url"]},
            status=status.HTTP_202_ACCEPTED,
            headers={"Location": shaped["url"]},
        )

    @document(
        summary="A bulk job's progress",
        description="Counts of runs done, skipped and failed so far, the skip reasons with the run "
        "ids of each (the first 100), the failures, and the job's status.",
        parameters=[JOB_ID],
        responses={200: s.BulkJobSerializer, **error_responses()},
    )
    @action(detail=False, methods=["get"], url_path=r"bulk/(?P<job_id>[^/]+)", url_name="bulk-job")
    def bulk_job(self, request: Request, job_id: str) -> Response:
        job = runtime.get_bulk_job(job_id)
        # With a run filter, a job names runs of its creator's: only its creator sees it.
        if weft_settings.API_RUN_FILTER is not None and job.created_by != request.user.get_username():
            raise exceptions.NotFound(f"no bulk job with id {job_id!r}")
        return Response(self._job_shape(job))

    def _job_shape(self, job: runtime.BulkJobRecord) -> dict[str, Any]:
        url = self.reverse_action("bulk-job", kwargs={"job_id": job.id})
        return dict(s.BulkJobSerializer({**job.as_dict(), "url": url}).data)


def _check_the_tick_sees_the_same_runs(
    runs: QuerySet[WorkflowRun], username: str, spec: dict[str, list[str]]
) -> None:
    """Refuse a job whose runs the tick could not find again: ``WEFT_API_RUN_FILTER`` is
    applied to a stand-in request there (the user only), and the list's filters by the
    runtime, which must give the runs this request gives. Two ``EXISTS`` over the
    matching runs, only with a run filter."""
    try:
        again = runs_listed(runs_seen_by(username), spec)
    except Exception:  # the project's run filter cannot take the stand-in (it reads a header...)
        logger.info("bulk: WEFT_API_RUN_FILTER fails on a stand-in request", exc_info=True)
        again = None
    if (
        again is None
        or runs.exclude(pk__in=again.values("pk")).exists()
        or again.exclude(pk__in=runs.values("pk")).exists()
    ):
        raise exceptions.PermissionDenied(
            "WEFT_API_RUN_FILTER gives other runs for this request than for its user alone, so a bulk "
            "job, which applies it later without the request, cannot be started; make the run filter "
            "depend on request.user only"
        )
