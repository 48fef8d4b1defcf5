"""``runs/``: list, start, inspect, message and operate runs. No rows are written here."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import exceptions, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from ... import runtime
from ...conf import weft_settings
from ...engine.errors import (
    ConcurrencyLimited,
    ResultTimeout,
    UpdateFailed,
    UpdateTimeout,
    WorkflowAlreadyExists,
    WorkflowFailed,
)
from ...engine.registry import registry
from ...models import WorkflowRun
from ...runtime.operations import UPDATE_WAIT_DEFAULT
from .. import serializers as s
from ..filters import RunFilter, SearchAttributeFilter, visible_runs
from ..pagination import RunCursorPagination
from ..schema import document
from .bulk import BulkRoutes
from .common import ERRORS, IDEMPOTENCY, REF, WAIT, error_responses, idempotency_key, requested_wait

_REF_PLACEHOLDER = "--weft-run-ref--"
_NOT_SHOWN = ("finalizer_state", "finalizer", "dispatched_at", "claimed_at", "parent_close_policy")
HISTORY_PAGE = 500


class RunViewSet(BulkRoutes):
    """Workflow runs: list, start, inspect, message and operate them."""

    lookup_field = "ref"
    lookup_value_regex = "[^/]+"
    pagination_class = RunCursorPagination
    filter_backends = [DjangoFilterBackend, SearchAttributeFilter]
    filterset_class = RunFilter
    serializer_class = s.RunSerializer
    read_only_actions = frozenset({"list", "retrieve", "history", "export"})

    def get_queryset(self) -> QuerySet[WorkflowRun]:
        runs = visible_runs(self.request, may_lag=self.reads_may_lag)
        if self.action == "list":
            # What a run's representation does not show stays in the database.
            runs = runs.defer(*_NOT_SHOWN)
        return runs

    # -- helpers ---------------------------------------------------------------------

    def _run(self, ref: str) -> WorkflowRun:
        """The run ``ref`` names, if this request may see it (else 404 ``not_found``); for a
        read-only action from the read database, else from the primary, which the action
        then changes or waits on."""
        run = runtime.get_run(ref, may_lag=self.reads_may_lag)
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
        responses={200: s.RunSerializer(many=True), **error_responses()},
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
        description="A workflow with a concurrency limit whose key has every slot taken: with "
        "`on_limit` `queue` the run is started and waits (status `pending`, `slot` `queued`); "
        "`cancel_new` refuses the start, 409 `concurrency_limited` with `details` `{workflow, key, "
        "limit, run_id}` (the oldest run holding the key), nothing written; `skip` answers 200 with "
        "the run holding the key; `cancel_running` cancels that run and starts this one (201).",
        request=s.StartRunSerializer,
        parameters=[IDEMPOTENCY],
        responses={
            201: OpenApiResponse(s.RunSerializer, description="Started; Location names the run."),
            200: OpenApiResponse(
                s.RunSerializer,
                description="A run with this id already existed, or (on_limit skip) the run "
                "holding the concurrency key.",
            ),
            **error_responses(409),
        },
    )
    def create(self, request: Request) -> Response:
        body = s.StartRunSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        filtered = weft_settings.API_RUN_FILTER is not None
        workflow_id = idempotency_key(request, data.get("id"))
        # With a run filter, the start and the check that the caller may see the run are
        # one transaction: a run outside the caller's runs is rolled back (its doorbell
        # rings on commit only), never left behind.
        with transaction.atomic(using=weft_settings.DATABASE_ALIAS) if filtered else nullcontext():
            try:
                started = runtime.start(
                    data["workflow"],
                    data["args"],
                    data["kwargs"],
                    id=workflow_id,
                    on_conflict=data["on_conflict"],
                    execution_timeout=data.get("execution_timeout"),
                    start_delay=data.get("start_delay"),
                    search_attributes=data["search_attributes"],
                    priority=data["priority"],
                )
            except WorkflowAlreadyExists as exc:
                if not self._visible(str(getattr(exc, "run_id", ""))):
                    raise self._taken(getattr(exc, "workflow_id", None)) from None
                raise
            except ConcurrencyLimited as exc:
                if not self._visible(str(getattr(exc, "run_id", ""))):
                    raise self._limited(exc) from None
                raise
            if not self._visible(started.run_id):
                if not started.created and started.workflow_id != workflow_id:
                    # on_limit="skip" found the key held by a run outside the caller's runs.
                    raise self._limited(self._held_by(started))
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
    def _held_by(started: runtime.StartResult) -> ConcurrencyLimited:
        """A skipped start (``on_limit="skip"``) as the refusal ``cancel_new`` would make."""
        run = runtime.get_run(started.run_id)
        limit = registry.concurrency_limits().get(run.workflow_name)
        return ConcurrencyLimited(
            "", workflow=run.workflow_name, key=run.concurrency_key, limit=limit.limit if limit else None
        )

    @staticmethod
    def _limited(exc: ConcurrencyLimited) -> ConcurrencyLimited:
        """The refusal without the run holding the key: it is outside the caller's runs."""
        workflow, key = getattr(exc, "workflow", None), getattr(exc, "key", None)
        where = f"key {key!r}" if key else "the workflow"
        return ConcurrencyLimited(
            f"workflow {workflow!r} has every concurrency slot of {where} taken, by runs you cannot "
            "see; try again once one frees",
            workflow=workflow,
            key=key,
            limit=getattr(exc, "limit", None),
            run_id=None,
        )

    @staticmethod
    def _taken(workflow_id: str | None) -> WorkflowAlreadyExists:
        return WorkflowAlreadyExists(
            f"the workflow id {workflow_id!r} is taken; choose another id", workflow_id=workflow_id
        )

    @document(summary="Get a run", parameters=[REF], responses={200: s.RunSerializer, **error_responses()})
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
        responses={200: s.HistoryPageSerializer, **error_responses()},
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
        responses={200: s.HistoryExportSerializer, **error_responses()},
    )
    @action(detail=True, methods=["get"])
    def export(self, request: Request, ref: str) -> Response:
        run = self._run(ref)
        document = runtime.export_history(str(run.pk), may_lag=self.reads_may_lag)
        return Response(s.HistoryExportSerializer(document).data)

    @document(
        summary="The run's result (long poll)",
        parameters=[REF, WAIT],
        responses={
            200: OpenApiResponse(s.ResultSerializer, description="Completed: the result."),
            202: OpenApiResponse(s.ResultSerializer, description="Not finished within wait: the status."),
            **error_responses(409),
        },
    )
    @action(detail=True, methods=["get"])
    def result(self, request: Request, ref: str) -> Response:
        wait = requested_wait(request.query_params.get("wait"))
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
        responses={202: s.SignalAcceptedSerializer, **error_responses(409)},
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
            signal_id=idempotency_key(request, body.validated_data.get("signal_id")),
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
            **error_responses(409),
        },
    )
    @action(detail=True, methods=["post"], url_path="update")
    def send_update(self, request: Request, ref: str) -> Response:
        body = s.UpdateRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        run = self._run(ref)
        update_id = idempotency_key(request, data.get("update_id")) or uuid.uuid4().hex
        wait = requested_wait(data.get("wait", UPDATE_WAIT_DEFAULT))
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
            **error_responses(409),
        },
    )
    @action(
        detail=True,
        methods=["get"],
        # Any update_id the POST accepts, slashes included.
        url_path=r"updates/(?P<update_id>.+)",
        url_name="update-outcome",
    )
    def update_outcome(self, request: Request, ref: str, update_id: str) -> Response:
        wait = requested_wait(request.query_params.get("wait"))
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
        responses={200: s.QueryResultSerializer, 422: ERRORS, **error_responses()},
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
        responses={200: s.TransitionSerializer, **error_responses(409)},
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
        responses={200: s.TransitionSerializer, **error_responses(409)},
    )
    @action(detail=True, methods=["post"])
    def suspend(self, request: Request, ref: str) -> Response:
        return self._transition(ref, runtime.suspend)

    @document(
        summary="Resume a suspended run",
        request=None,
        parameters=[REF],
        responses={200: s.TransitionSerializer, **error_responses(409)},
    )
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, ref: str) -> Response:
        return self._transition(ref, runtime.resume)

    @document(
        summary="Retry a failed run from its failed step",
        request=None,
        parameters=[REF],
        responses={200: s.TransitionSerializer, **error_responses(409)},
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
            **error_responses(409),
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
