"""REST views: parse, call the runtime, shape. No rows are written here.

Routes and shapes are docs/reference/rest.md's; errors are the envelope of ``exceptions.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from django.db import transaction
from django.db.models import Count, QuerySet
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import exceptions, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import runtime
from ..conf import weft_settings
from ..engine.errors import (
    ResultTimeout,
    ScheduleManaged,
    UpdateFailed,
    UpdateTimeout,
    WorkflowAlreadyExists,
    WorkflowFailed,
)
from ..engine.registry import registry
from ..models import Schedule, WorkflowRun
from ..models.schedules import SCHEDULE_ID_MAX_LENGTH
from ..runtime.schedules import SCHEDULE_ID as SCHEDULE_ID_PATTERN
from . import serializers as s
from .bulk import RUNS_FROM, runs_seen_by
from .bulk import params_of as bulk_params
from .exceptions import weft_exception_handler
from .filters import RunFilter, ScheduleFilter, SearchAttributeFilter, filter_runs, visible_runs
from .pagination import RunCursorPagination, ScheduleCursorPagination
from .parsers import BoundedJSONParser, body_limit, declared_length, too_large
from .permissions import permission_classes
from .schema import document

logger = logging.getLogger("django_weft.api")

IDEMPOTENCY_HEADER = "Idempotency-Key"
_REF_PLACEHOLDER = "--weft-run-ref--"
_NOT_SHOWN = ("finalizer_state", "finalizer", "dispatched_at", "claimed_at", "parent_close_policy")
HISTORY_PAGE = 500

ERRORS = OpenApiResponse(s.ErrorSerializer, description="The error envelope (see `error.code`).")


def _errors(*codes: int) -> dict[int, OpenApiResponse]:
    return dict.fromkeys((400, 401, 403, 404, 413, *codes), ERRORS)


class WeftAPIView(APIView):
    """What every django_weft view shares: JSON only, a bounded body, the error envelope,
    the configured permissions and a schema that does not depend on the project's
    ``DEFAULT_SCHEMA_CLASS``. ``weft_resource`` (``"runs"`` or ``"schedules"``) says
    which permissions the view's actions need."""

    parser_classes = [BoundedJSONParser]
    renderer_classes = [JSONRenderer]
    schema = AutoSchema()
    weft_action: str | None = None
    weft_resource = "runs"

    def get_permissions(self) -> list[BasePermission]:
        return [permission() for permission in permission_classes()]

    def get_exception_handler(self) -> Callable[..., Response | None]:
        return weft_exception_handler

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # Before authentication reads anything: a declared length over the limit is
        # refused without waiting for a body that may never come.
        declared = declared_length(request.META)
        if declared is not None and declared > body_limit():
            raise too_large(declared)
        # A method the route does not have is a 405 for everyone, before permissions.
        if getattr(self, request.method.lower(), None) is None:
            raise exceptions.MethodNotAllowed(request.method)
        super().initial(request, *args, **kwargs)


def _wait(raw: Any, what: str = "wait") -> float:
    """A ``wait`` in seconds from a client, capped by ``WEFT_API_MAX_WAIT``."""
    if raw is None or raw == "":
        return 0.0
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        raise exceptions.ValidationError({what: f"A number of seconds; got {raw!r}."}) from None
    if seconds != seconds or seconds < 0 or seconds in (float("inf"),):
        raise exceptions.ValidationError({what: f"A number of seconds, 0 or more; got {raw!r}."})
    return min(seconds, weft_settings.API_MAX_WAIT)


def _key(request: Request, given: Any) -> Any:
    """The body's id if it gives one, else the ``Idempotency-Key`` header, else ``None``."""
    if given not in (None, ""):
        return given
    header = request.headers.get(IDEMPOTENCY_HEADER)
    return header if header else None


REF = OpenApiParameter(
    "ref",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    description="A run id, or a workflow id (meaning its latest run).",
)
WAIT = OpenApiParameter(
    "wait",
    OpenApiTypes.NUMBER,
    OpenApiParameter.QUERY,
    required=False,
    description="Seconds to wait for an outcome (long poll), capped by WEFT_API_MAX_WAIT. Default 0.",
)
JOB_ID = OpenApiParameter(
    "job_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The bulk job's id."
)
IDEMPOTENCY = OpenApiParameter(
    IDEMPOTENCY_HEADER,
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=False,
    description="Used as the id (run id, signal_id, update_id) when the body gives none: a retry "
    "after a timeout gets the first outcome.",
)


class RunViewSet(WeftAPIView, viewsets.GenericViewSet):
    """Workflow runs: list, start, inspect, message and operate them."""

    lookup_field = "ref"
    lookup_value_regex = "[^/]+"
    pagination_class = RunCursorPagination
    filter_backends = [DjangoFilterBackend, SearchAttributeFilter]
    filterset_class = RunFilter
    serializer_class = s.RunSerializer

    def get_queryset(self) -> QuerySet[WorkflowRun]:
        runs = visible_runs(self.request)
        if self.action == "list":
            # What a run's representation does not show stays in the database.
            runs = runs.defer(*_NOT_SHOWN)
        return runs

    # -- helpers ---------------------------------------------------------------------

    def _run(self, ref: str) -> WorkflowRun:
        """The run ``ref`` names, if this request may see it (else 404 ``not_found``)."""
        run = runtime.get_run(ref)
        if weft_settings.API_RUN_FILTER is not None and not self.get_queryset().filter(pk=run.pk).exists():
            raise exceptions.NotFound(f"no workflow run has run id or workflow id {ref!r}")
        return run

    def _described(
        self, run: WorkflowRun | runtime.RunRecord, url_template: str | None = None
    ) -> dict[str, Any]:
        data = run.as_dict() if isinstance(run, runtime.RunRecord) else runtime.describe(run)
        template = url_template or self._url_template()
        data["url"] = template.replace(_REF_PLACEHOLDER, str(data["run_id"]))
        return data

    def _url_template(self) -> str:
        """The detail URL with a placeholder for the run id: one ``reverse`` per request."""
        return str(self.reverse_action("detail", kwargs={"ref": _REF_PLACEHOLDER}))

    def _shape(self, run: WorkflowRun | runtime.RunRecord) -> dict[str, Any]:
        return dict(s.RunSerializer(self._described(run)).data)

    def _transition(self, ref: str, operation: Callable[[str], str]) -> Response:
        run = self._run(ref)
        new_status = operation(str(run.pk))
        fresh = runtime.get_run(str(run.pk))
        return Response({"status": new_status, "run": self._shape(fresh)})

    # -- runs --------------------------------------------------------------------------

    @document(
        summary="List runs",
        parameters=[
            OpenApiParameter(
                "search.<attr>",
                OpenApiTypes.STR,
                OpenApiParameter.QUERY,
                required=False,
                description="Runs whose search attribute <attr> has this value (e.g. search.customer=7).",
            )
        ],
        responses={200: s.RunSerializer(many=True), **_errors()},
    )
    def list(self, request: Request) -> Response:
        runs = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(runs)
        # One serializer for the page: its fields are built once, not once per run.
        template = self._url_template()
        described = [self._described(run, template) for run in page or []]
        return self.get_paginated_response(s.RunSerializer(described, many=True).data)

    @document(
        summary="Start a run",
        request=s.StartRunSerializer,
        parameters=[IDEMPOTENCY],
        responses={
            201: OpenApiResponse(s.RunSerializer, description="Started; Location names the run."),
            200: OpenApiResponse(s.RunSerializer, description="A run with this id already existed."),
            **_errors(409),
        },
    )
    def create(self, request: Request) -> Response:
        body = s.StartRunSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        filtered = weft_settings.API_RUN_FILTER is not None
        # With a run filter, the start and the check that the caller may see the run are
        # one transaction: a run outside the caller's runs is rolled back (its doorbell
        # rings on commit only), never left behind.
        with transaction.atomic(using=weft_settings.DATABASE_ALIAS) if filtered else nullcontext():
            try:
                started = runtime.start(
                    data["workflow"],
                    data["args"],
                    data["kwargs"],
                    id=_key(request, data.get("id")),
                    on_conflict=data["on_conflict"],
                    execution_timeout=data.get("execution_timeout"),
                    start_delay=data.get("start_delay"),
                    search_attributes=data["search_attributes"],
                )
            except WorkflowAlreadyExists as exc:
                if not self._visible(str(getattr(exc, "run_id", ""))):
                    raise self._taken(getattr(exc, "workflow_id", None)) from None
                raise
            if not self._visible(started.run_id):
                if not started.created:
                    # An existing run outside the caller's runs: the id is taken, nothing more.
                    raise self._taken(started.workflow_id)
                raise exceptions.PermissionDenied("You may not start a run outside the runs you can see.")
        shaped = self._shape(started.record or runtime.get_run(started.run_id))
        if not started.created:
            return Response(shaped, status=status.HTTP_200_OK)
        return Response(shaped, status=status.HTTP_201_CREATED, headers={"Location": shaped["url"]})

    def _visible(self, run_id: str) -> bool:
        if weft_settings.API_RUN_FILTER is None:
            return True
        try:
            return self.get_queryset().filter(pk=uuid.UUID(run_id)).exists()
        except ValueError:
            return False

    @staticmethod
    def _taken(workflow_id: str | None) -> WorkflowAlreadyExists:
        return WorkflowAlreadyExists(
            f"the workflow id {workflow_id!r} is taken; choose another id", workflow_id=workflow_id
        )

    @document(summary="Get a run", parameters=[REF], responses={200: s.RunSerializer, **_errors()})
    def retrieve(self, request: Request, ref: str) -> Response:
        return Response(self._shape(self._run(ref)))

    @document(
        summary="The run's recorded history",
        parameters=[
            REF,
            OpenApiParameter(
                "after_seq",
                OpenApiTypes.INT,
                OpenApiParameter.QUERY,
                required=False,
                description="Only entries after this position (the next page).",
            ),
        ],
        responses={200: s.HistoryPageSerializer, **_errors()},
    )
    @action(detail=True, methods=["get"])
    def history(self, request: Request, ref: str) -> Response:
        raw = request.query_params.get("after_seq", "-1")
        try:
            after = int(raw)
        except ValueError:
            raise exceptions.ValidationError(
                {"after_seq": f"A position (an integer); got {raw!r}."}
            ) from None
        run = self._run(ref)
        entries = [entry for entry in runtime.history(run) if entry["seq"] > after]
        page, more = entries[:HISTORY_PAGE], len(entries) > HISTORY_PAGE
        next_url = None
        if more:
            next_url = request.build_absolute_uri(f"{request.path}?after_seq={page[-1]['seq']}")
        return Response({"results": s.HistoryEntrySerializer(page, many=True).data, "next": next_url})

    @document(
        summary="The run's history as a file for weft_replay",
        description="The whole recorded history of the run in the django_weft.history format "
        "(version 1), the document `manage.py weft_export_history RUN` writes; save it and replay "
        "it with `manage.py weft_replay --from-file`.",
        parameters=[REF],
        responses={200: s.HistoryExportSerializer, **_errors()},
    )
    @action(detail=True, methods=["get"])
    def export(self, request: Request, ref: str) -> Response:
        run = self._run(ref)
        return Response(s.HistoryExportSerializer(runtime.export_history(str(run.pk))).data)

    @document(
        summary="The run's result (long poll)",
        parameters=[REF, WAIT],
        responses={
            200: OpenApiResponse(s.ResultSerializer, description="Completed: the result."),
            202: OpenApiResponse(s.ResultSerializer, description="Not finished within wait: the status."),
            **_errors(409),
        },
    )
    @action(detail=True, methods=["get"])
    def result(self, request: Request, ref: str) -> Response:
        wait = _wait(request.query_params.get("wait"))
        run = self._run(ref)
        # result_of polls with short autocommit reads: no transaction or lock is held.
        try:
            value = runtime.result_of(str(run.pk), timeout=wait)
        except ResultTimeout as exc:
            return Response({"status": getattr(exc, "status", "running")}, status=status.HTTP_202_ACCEPTED)
        except WorkflowFailed:
            raise
        return Response({"status": "completed", "result": value})

    # -- messages ----------------------------------------------------------------------

    @document(
        summary="Send a signal",
        request=s.SignalRequestSerializer,
        parameters=[REF, IDEMPOTENCY],
        responses={202: s.SignalAcceptedSerializer, **_errors(409)},
    )
    @action(detail=True, methods=["post"])
    def signal(self, request: Request, ref: str) -> Response:
        body = s.SignalRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = self._run(ref)
        accepted = runtime.signal(
            str(run.pk),
            body.validated_data["name"],
            body.validated_data["payload"],
            signal_id=_key(request, body.validated_data.get("signal_id")),
        )
        return Response(s.SignalAcceptedSerializer(accepted).data, status=status.HTTP_202_ACCEPTED)

    @document(
        summary="Send an update and wait for its outcome",
        request=s.UpdateRequestSerializer,
        parameters=[REF, IDEMPOTENCY],
        responses={
            200: OpenApiResponse(s.UpdateOutcomeSerializer, description="Applied: the handler's result."),
            202: OpenApiResponse(s.UpdateOutcomeSerializer, description="Accepted, no outcome within wait."),
            422: OpenApiResponse(s.ErrorSerializer, description="The handler raised (update_failed)."),
            **_errors(409),
        },
    )
    @action(detail=True, methods=["post"], url_path="update")
    def send_update(self, request: Request, ref: str) -> Response:
        body = s.UpdateRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        run = self._run(ref)
        update_id = _key(request, data.get("update_id")) or uuid.uuid4().hex
        wait = _wait(data.get("wait", 10.0))
        return self._update_outcome(
            update_id,
            lambda: runtime.update(
                str(run.pk), data["name"], data["payload"], update_id=update_id, wait=wait
            ),
        )

    @document(
        summary="An update's outcome (long poll)",
        parameters=[REF, WAIT],
        responses={
            200: s.UpdateOutcomeSerializer,
            202: s.UpdateOutcomeSerializer,
            422: OpenApiResponse(s.ErrorSerializer, description="The handler raised (update_failed)."),
            **_errors(409),
        },
    )
    @action(
        detail=True,
        methods=["get"],
        url_path=r"updates/(?P<update_id>[^/]+)",
        url_name="update-outcome",
    )
    def update_outcome(self, request: Request, ref: str, update_id: str) -> Response:
        wait = _wait(request.query_params.get("wait"))
        run = self._run(ref)
        return self._update_outcome(
            update_id, lambda: runtime.update_result(str(run.pk), update_id, wait=wait)
        )

    @staticmethod
    def _update_outcome(update_id: str, call: Callable[[], Any]) -> Response:
        try:
            result = call()
        except UpdateTimeout:
            return Response({"update_id": update_id, "status": "accepted"}, status=status.HTTP_202_ACCEPTED)
        except UpdateFailed:
            raise
        return Response({"update_id": update_id, "status": "completed", "result": result})

    @document(
        summary="Run a query handler",
        request=s.QueryRequestSerializer,
        parameters=[REF],
        responses={200: s.QueryResultSerializer, 422: ERRORS, **_errors()},
    )
    @action(detail=True, methods=["post"])
    def query(self, request: Request, ref: str) -> Response:
        body = s.QueryRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = self._run(ref)
        result = runtime.query(str(run.pk), body.validated_data["name"], body.validated_data["args"])
        return Response({"result": result})

    # -- lifecycle ---------------------------------------------------------------------

    @document(
        summary="Cancel the run (now, or by a request the workflow receives)",
        description="`mode` `terminate` (the default) cancels the run now: 200 with status "
        "`cancelled`. `request` stores a cancellation request and wakes a parked run: the "
        "workflow receives it at its current or next blocking point and may clean up with "
        "durable steps (or carry on); 200 with the run's status now (`running` when it woke "
        "it). A request while one is pending stores nothing new. 409 for a finished run.",
        request=s.CancelRequestSerializer,
        parameters=[REF],
        responses={200: s.TransitionSerializer, **_errors(409)},
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, ref: str) -> Response:
        body = s.CancelRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        reason = body.validated_data.get("reason") or None
        mode = body.validated_data["mode"]
        return self._transition(ref, lambda run_id: runtime.cancel(run_id, reason, mode=mode))

    @document(
        summary="Suspend the run",
        request=None,
        parameters=[REF],
        responses={200: s.TransitionSerializer, **_errors(409)},
    )
    @action(detail=True, methods=["post"])
    def suspend(self, request: Request, ref: str) -> Response:
        return self._transition(ref, runtime.suspend)

    @document(
        summary="Resume a suspended run",
        request=None,
        parameters=[REF],
        responses={200: s.TransitionSerializer, **_errors(409)},
    )
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, ref: str) -> Response:
        return self._transition(ref, runtime.resume)

    @document(
        summary="Retry a failed run from its failed step",
        request=None,
        parameters=[REF],
        responses={200: s.TransitionSerializer, **_errors(409)},
    )
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, ref: str) -> Response:
        return self._transition(ref, runtime.retry)

    @document(
        summary="Reset the run to a position of its history",
        description="Starts a new run of the workflow id that keeps (replays, never runs again) "
        "the entries before `to_seq` and continues live from there, with `args`/`kwargs` replacing "
        "the input if given. The run, if still active, is closed (`cancelled`), in the same "
        "transaction; both runs link to each other (`reset_from`, `reset_to`). 201 with the new run "
        "(Location names it). 400 `invalid` (details name `to_seq`) for a position the history "
        "cannot be cut at, and nothing is written; 409 `conflict` for a run that is not the latest "
        "of its workflow id. Needs cancel_workflowrun and add_workflowrun.",
        request=s.ResetRequestSerializer,
        parameters=[REF],
        responses={
            201: OpenApiResponse(s.ResetSerializer, description="The new run; Location names it."),
            **_errors(409),
        },
    )
    @action(detail=True, methods=["post"])
    def reset(self, request: Request, ref: str) -> Response:
        # Checked as "reset" (cancel_workflowrun) already; it starts a run too.
        self.weft_action = "create"
        self.check_permissions(request)
        body = s.ResetRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        run = self._run(ref)
        outcome = runtime.reset(
            str(run.pk),
            data["to_seq"],
            args=data.get("args"),
            kwargs=data.get("kwargs"),
            reason=data["reason"],
        )
        template = self._url_template()
        new = dict(s.RunSerializer(self._described(runtime.read_run(outcome.run_id), template)).data)
        previous = dict(s.RunSerializer(self._described(runtime.read_run(str(run.pk)), template)).data)
        return Response(
            {"status": new["status"], "run": new, "previous_run": previous},
            status=status.HTTP_201_CREATED,
            headers={"Location": new["url"]},
        )

    # -- bulk operations ---------------------------------------------------------------

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
            **_errors(),
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
            runs = filter_runs(visible_runs(request), bulk_params(data["filter"]))
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
            runs_from=RUNS_FROM,
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
        responses={200: s.BulkJobSerializer, **_errors()},
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
    applied to a stand-in request there (the user only), which must give the runs this
    request gives. Two ``EXISTS`` over the matching runs, only with a run filter."""
    try:
        again = filter_runs(runs_seen_by(username), bulk_params(spec))
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


SCHEDULE_ID = OpenApiParameter(
    "id", OpenApiTypes.STR, OpenApiParameter.PATH, description="The schedule's id."
)
_ID_PLACEHOLDER = "--weft-schedule-id--"
BACKFILL_LIMIT = 500
"""The most scheduled times one ``backfill/`` request fires: each start is a few
milliseconds, and the request holds the schedule's lock. A longer range is split into
several requests, which is safe because a backfill is idempotent."""


class ScheduleViewSet(WeftAPIView, viewsets.GenericViewSet):
    """Schedules: list, create, inspect, change, delete, pause, trigger and backfill them.

    A schedule declared in code (``managed``) keeps what its declaration sets: changing
    it here is a 409 ``conflict`` saying to change the code; its note, pausing, triggers
    and backfills are the operators'."""

    weft_resource = "schedules"
    lookup_field = "id"
    lookup_value_regex = "[^/]+"
    pagination_class = ScheduleCursorPagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = ScheduleFilter
    serializer_class = s.ScheduleSerializer

    def get_queryset(self) -> QuerySet[Schedule]:
        return Schedule.objects.using(weft_settings.DATABASE_ALIAS).all()

    # -- helpers ---------------------------------------------------------------------

    @staticmethod
    def _id(raw: str) -> str:
        """The path's schedule id; one no schedule can have is simply not found."""
        if len(raw) > SCHEDULE_ID_MAX_LENGTH or not SCHEDULE_ID_PATTERN.fullmatch(raw):
            raise exceptions.NotFound(f"no schedule with id {raw!r}")
        return raw

    def _url_template(self) -> str:
        """The detail URL with a placeholder for the id: one ``reverse`` per request."""
        return str(self.reverse_action("detail", kwargs={"id": _ID_PLACEHOLDER}))

    def _shaped(self, descriptions: list[runtime.ScheduleDescription]) -> list[dict[str, Any]]:
        template = self._url_template()
        described = [
            {**dataclasses.asdict(description), "url": template.replace(_ID_PLACEHOLDER, description.id)}
            for description in descriptions
        ]
        # One serializer for them all: its fields are built once.
        return list(s.ScheduleSerializer(described, many=True).data)

    def _shape(self, schedule: Schedule) -> dict[str, Any]:
        return self._shaped(runtime.describe_schedules([schedule]))[0]

    # -- schedules ---------------------------------------------------------------------

    @document(summary="List schedules", responses={200: s.ScheduleSerializer(many=True), **_errors()})
    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        return self.get_paginated_response(self._shaped(runtime.describe_schedules(list(page or []))))

    @document(
        summary="Create a schedule",
        request=s.CreateScheduleSerializer,
        responses={
            201: OpenApiResponse(s.ScheduleSerializer, description="Created; Location names it."),
            **_errors(409),
        },
    )
    def create(self, request: Request) -> Response:
        body = s.CreateScheduleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        options = dict(body.validated_data)
        schedule = runtime.create_schedule(options.pop("id"), options.pop("workflow"), **options)
        shaped = self._shape(schedule)
        return Response(shaped, status=status.HTTP_201_CREATED, headers={"Location": shaped["url"]})

    @document(
        summary="Get a schedule", parameters=[SCHEDULE_ID], responses={200: s.ScheduleSerializer, **_errors()}
    )
    def retrieve(self, request: Request, id: str) -> Response:
        return Response(self._shaped([runtime.describe_schedule(self._id(id))])[0])

    @document(
        summary="Change a schedule",
        description="The keys given change, the others stay; a changed spec fires from its next time "
        "after now. A schedule declared in code (managed) changes only its note here (409 conflict).",
        request=s.UpdateScheduleSerializer,
        parameters=[SCHEDULE_ID],
        responses={200: s.ScheduleSerializer, **_errors(409)},
    )
    def partial_update(self, request: Request, id: str) -> Response:
        body = s.UpdateScheduleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        schedule = runtime.update_schedule(self._id(id), refuse_managed=True, **body.validated_data)
        return Response(self._shape(schedule))

    @document(
        summary="Delete a schedule",
        description="Its runs are kept. A schedule declared in code (managed) is refused with 409 "
        "conflict unless ?force=true (the next weft_schedules sync creates it again while declared).",
        parameters=[
            SCHEDULE_ID,
            OpenApiParameter(
                "force",
                OpenApiTypes.BOOL,
                OpenApiParameter.QUERY,
                required=False,
                description="Delete a schedule declared in code too.",
            ),
        ],
        responses={204: None, **_errors(409)},
    )
    def destroy(self, request: Request, id: str) -> Response:
        force = _flag(request.query_params.get("force"), "force")
        schedule_id = self._id(id)
        try:
            runtime.delete_schedule(schedule_id, refuse_managed=not force)
        except ScheduleManaged as exc:
            raise ScheduleManaged(
                f"{exc.message}. DELETE with ?force=true deletes it anyway; while it is declared, the next "
                "sync creates it again",
                schedule_id=schedule_id,
                declared=[],
            ) from None
        return Response(status=status.HTTP_204_NO_CONTENT)

    # -- operations --------------------------------------------------------------------

    @document(
        summary="Pause a schedule",
        description="No fire until unpause/; times passing meanwhile neither fire nor count as missed.",
        request=s.PauseRequestSerializer,
        parameters=[SCHEDULE_ID],
        responses={200: s.ScheduleSerializer, **_errors()},
    )
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, id: str) -> Response:
        body = s.PauseRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        schedule = runtime.pause_schedule(self._id(id), body.validated_data.get("note", ""))
        return Response(self._shape(schedule))

    @document(
        summary="Unpause a schedule",
        description="Fires again from the spec's next time after now; the note is replaced (default empty).",
        request=s.PauseRequestSerializer,
        parameters=[SCHEDULE_ID],
        responses={200: s.ScheduleSerializer, **_errors()},
    )
    @action(detail=True, methods=["post"])
    def unpause(self, request: Request, id: str) -> Response:
        body = s.PauseRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        schedule = runtime.unpause_schedule(self._id(id), body.validated_data.get("note", ""))
        return Response(self._shape(schedule))

    @document(
        summary="Fire a schedule now",
        description="Scheduled time: now, to the second; under the schedule's overlap policy or the "
        "one given. A paused schedule can be triggered.",
        request=s.TriggerRequestSerializer,
        parameters=[SCHEDULE_ID],
        responses={200: s.ScheduleActionSerializer, **_errors()},
    )
    @action(detail=True, methods=["post"])
    def trigger(self, request: Request, id: str) -> Response:
        body = s.TriggerRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        fired = runtime.trigger_schedule(self._id(id), overlap=body.validated_data.get("overlap"))
        return Response(s.ScheduleActionSerializer(fired).data)

    @document(
        summary="Fire the scheduled times of a range",
        description="Each scheduled time in [start, end] fires once, oldest first, under overlap "
        "(default allow_all); a time whose run exists starts nothing (already_started), so a "
        f"repeated backfill is a no-op. At most {BACKFILL_LIMIT} times per request: split longer ranges.",
        request=s.BackfillRequestSerializer,
        parameters=[SCHEDULE_ID],
        responses={200: s.BackfillSerializer, **_errors()},
    )
    @action(detail=True, methods=["post"])
    def backfill(self, request: Request, id: str) -> Response:
        body = s.BackfillRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        fired = runtime.backfill_schedule(
            self._id(id), data["start"], data["end"], overlap=data["overlap"], limit=BACKFILL_LIMIT
        )
        return Response({"actions": s.ScheduleActionSerializer(fired, many=True).data})


def _flag(raw: str | None, what: str) -> bool:
    """A boolean query parameter: ``true``/``false``, ``1``/``0``, absent is false."""
    if raw is None or raw == "":
        return False
    if raw.lower() in ("true", "1"):
        return True
    if raw.lower() in ("false", "0"):
        return False
    raise exceptions.ValidationError({what: f"Give true or false; got {raw!r}."})


class WorkflowListView(WeftAPIView):
    """The registered workflows, their parameters and how many runs each has per status."""

    weft_action = "workflows"

    @document(summary="Registered workflows", responses={200: s.WorkflowSerializer(many=True), **_errors()})
    def get(self, request: Request) -> Response:
        counts: dict[str, dict[str, int]] = {}
        rows = visible_runs(request).order_by().values("workflow_name", "status").annotate(n=Count("pk"))
        for row in rows:
            counts.setdefault(row["workflow_name"], {})[row["status"]] = row["n"]
        workflows = []
        for name, definition in sorted(registry.workflows.items()):
            doc = inspect.getdoc(definition.fn) or ""
            workflows.append(
                {
                    "name": name,
                    "description": doc.strip().splitlines()[0] if doc.strip() else "",
                    "parameters": _parameters(definition.fn),
                    "has_finalizer": definition.finalizer is not None,
                    "counts": {status: counts.get(name, {}).get(status, 0) for status in s.STATUS_CHOICES},
                }
            )
        return Response(s.WorkflowSerializer(workflows, many=True).data)


def _parameters(fn: Callable[..., Any]) -> list[dict[str, Any]]:
    """The workflow function's parameters after ``ctx``."""
    parameters = list(inspect.signature(fn).parameters.values())[1:]
    described = []
    for parameter in parameters:
        entry: dict[str, Any] = {
            "name": parameter.name,
            "kind": parameter.kind.name.lower(),
            "required": parameter.default is inspect.Parameter.empty
            and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD),
            "annotation": _annotation(parameter.annotation),
        }
        if parameter.default is not inspect.Parameter.empty:
            entry["default"] = _json_or_repr(parameter.default)
        described.append(entry)
    return described


def _annotation(annotation: Any) -> str | None:
    if annotation is inspect.Parameter.empty:
        return None
    if isinstance(annotation, str):
        return annotation
    return getattr(annotation, "__name__", None) or repr(annotation)


def _json_or_repr(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value
