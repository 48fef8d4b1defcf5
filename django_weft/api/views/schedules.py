"""``schedules/``: list, create, inspect, change, delete, pause, trigger and backfill
schedules. No rows are written here."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db.models import QuerySet
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import exceptions, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from ... import runtime
from ...engine.errors import ScheduleManaged
from ...models import Schedule
from ...models.schedules import SCHEDULE_ID_MAX_LENGTH
from ...runtime.operations import BACKFILL_LIMIT
from ...runtime.schedules import SCHEDULE_ID as SCHEDULE_ID_PATTERN
from .. import serializers as s
from ..filters import ScheduleFilter
from ..pagination import ScheduleCursorPagination
from ..schema import document
from .common import WeftAPIView, error_responses

SCHEDULE_ID = OpenApiParameter(
    "id", OpenApiTypes.STR, OpenApiParameter.PATH, description="The schedule's id."
)
_ID_PLACEHOLDER = "--weft-schedule-id--"
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
    read_only_actions = frozenset({"list", "retrieve"})

    def get_queryset(self) -> QuerySet[Schedule]:
        return runtime.schedule_queryset(may_lag=self.reads_may_lag)

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

    @document(summary="List schedules", responses={200: s.ScheduleSerializer(many=True), **error_responses()})
    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        return self.get_paginated_response(self._shaped(runtime.describe_schedules(list(page or []))))

    @document(
        summary="Create a schedule",
        request=s.CreateScheduleSerializer,
        responses={
            201: OpenApiResponse(s.ScheduleSerializer, description="Created; Location names it."),
            **error_responses(409),
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
        summary="Get a schedule",
        parameters=[SCHEDULE_ID],
        responses={200: s.ScheduleSerializer, **error_responses()},
    )
    def retrieve(self, request: Request, id: str) -> Response:
        described = runtime.describe_schedule(self._id(id), may_lag=self.reads_may_lag)
        return Response(self._shaped([described])[0])

    @document(
        summary="Change a schedule",
        description="The keys given change, the others stay; a changed spec fires from its next time "
        "after now. A schedule declared in code (managed) changes only its note here (409 conflict).",
        request=s.UpdateScheduleSerializer,
        parameters=[SCHEDULE_ID],
        responses={200: s.ScheduleSerializer, **error_responses(409)},
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
        responses={204: None, **error_responses(409)},
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
        responses={200: s.ScheduleSerializer, **error_responses()},
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
        responses={200: s.ScheduleSerializer, **error_responses()},
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
        responses={200: s.ScheduleActionSerializer, **error_responses()},
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
        responses={200: s.BackfillSerializer, **error_responses()},
    )
    @action(detail=True, methods=["post"])
    def backfill(self, request: Request, id: str) -> Response:
        body = s.BackfillRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        fired = runtime.backfill_schedule(self._id(id), data["start"], data["end"], overlap=data["overlap"])
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
