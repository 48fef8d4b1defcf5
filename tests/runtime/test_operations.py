"""The operations catalogue is the one description each surface reads: for every operation
that takes a reason (or a note) or a wait, the admin's form, the REST serializer and the
runtime accept the same longest value and refuse the same one character more, and refuse
the same out-of-range wait; and they take a start's priority within the same range. A
surface that kept a limit of its own fails here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django import forms
from django.contrib.auth.models import Permission
from rest_framework import serializers

from django_weft import client, runtime
from django_weft.admin.runs.actions import ReasonForm
from django_weft.admin.runs.forms import StartWorkflowForm, UpdateForm
from django_weft.admin.runs.reset import ResetForm
from django_weft.admin.schedules.forms import PauseForm, note_field
from django_weft.api import serializers as s
from django_weft.engine.errors import InvalidInput
from django_weft.models import Schedule, WorkflowRun
from django_weft.runtime.operations import BACKFILL_LIMIT, OPERATIONS, START_PRIORITY, Operation

pytestmark = pytest.mark.django_db


class _ScheduleNoteForm(forms.Form):
    """The note field the admin's schedule form uses."""

    note = note_field()


@dataclass(frozen=True)
class Surfaces:
    """One operation's reason at each surface: a form, a serializer, a runtime call."""

    form: Callable[[str], forms.Form]
    serializer: Callable[[str], serializers.Serializer]
    target: Callable[[], str]
    """Makes the run or schedule the runtime call acts on."""
    runtime: Callable[[str, str], object]


def _pending_run() -> str:
    return str(client.start("tests.sleepy").run_id)


def _schedule() -> str:
    if not Schedule.objects.filter(pk="catalogue").exists():
        client.create_schedule("catalogue", "tests.echo", args=[1], every="1h")
    return "catalogue"


def _surfaces(name: str) -> Surfaces:
    if name in ("cancel", "terminate", "request_cancel"):
        mode = "request" if name == "request_cancel" else "terminate"
        return Surfaces(
            form=lambda reason: ReasonForm({"mode": mode, "reason": reason}),
            serializer=lambda reason: (
                s.CancelRequestSerializer(data={"mode": mode, "reason": reason})
                if name == "cancel"
                else s.BulkRequestSerializer(
                    data={"action": name, "filter": {"status": "waiting"}, "reason": reason}
                )
            ),
            target=_pending_run,
            runtime=lambda run_id, reason: (
                runtime.cancel(run_id, reason, mode=mode)
                if name == "cancel"
                else runtime.apply_bulk(name, [run_id], reason=reason)
            ),
        )
    if name == "reset":
        return Surfaces(
            form=lambda reason: ResetForm({"to_seq": 0, "reason": reason}),
            serializer=lambda reason: s.ResetRequestSerializer(data={"to_seq": 0, "reason": reason}),
            target=_pending_run,
            runtime=lambda run_id, reason: runtime.reset(run_id, 0, reason=reason),
        )
    if name in ("pause", "unpause"):
        call = runtime.pause_schedule if name == "pause" else runtime.unpause_schedule
        return Surfaces(
            form=lambda note: PauseForm({"note": note}),
            serializer=lambda note: s.PauseRequestSerializer(data={"note": note}),
            target=_schedule,
            runtime=lambda schedule_id, note: call(schedule_id, note),
        )
    if name == "create_schedule":
        return Surfaces(
            form=lambda note: _ScheduleNoteForm({"note": note}),
            serializer=lambda note: s.CreateScheduleSerializer(data={"note": note}, partial=True),
            target=lambda: "created",
            runtime=lambda schedule_id, note: client.create_schedule(
                schedule_id, "tests.echo", args=[1], every="1h", note=note
            ),
        )
    if name == "change_schedule":
        return Surfaces(
            form=lambda note: _ScheduleNoteForm({"note": note}),
            serializer=lambda note: s.UpdateScheduleSerializer(data={"note": note}, partial=True),
            target=_schedule,
            runtime=lambda schedule_id, note: runtime.update_schedule(schedule_id, note=note),
        )
    raise AssertionError(f"the test does not know where {name} takes its reason: add it here")


WITH_REASON = sorted(name for name, operation in OPERATIONS.items() if operation.reason is not None)


def test_every_operation_with_a_reason_is_covered() -> None:
    assert WITH_REASON == [
        "cancel",
        "change_schedule",
        "create_schedule",
        "pause",
        "request_cancel",
        "reset",
        "terminate",
        "unpause",
    ]


def _refused_field(form: forms.Form) -> set[str]:
    return set(form.errors) if not form.is_valid() else set()


def _refused_key(serializer: serializers.Serializer) -> set[str]:
    return set(serializer.errors) if not serializer.is_valid() else set()


@pytest.mark.parametrize("name", WITH_REASON)
def test_the_longest_reason_is_the_same_at_every_surface(name: str) -> None:
    described: Operation = OPERATIONS[name]
    assert described.reason is not None
    limit, field = described.reason.max_length, described.reason.field
    surfaces = _surfaces(name)
    longest, too_long = "r" * limit, "r" * (limit + 1)

    assert field not in _refused_field(surfaces.form(longest))
    assert field not in _refused_key(surfaces.serializer(longest))

    form = surfaces.form(too_long)
    assert field in _refused_field(form)
    assert str(limit) in " ".join(form.errors[field])
    serializer = surfaces.serializer(too_long)
    assert field in _refused_key(serializer)
    assert str(limit) in " ".join(str(error) for error in serializer.errors[field])

    target = surfaces.target()
    before = _state()
    with pytest.raises(InvalidInput, match=f"the limit is {limit}") as refused:
        surfaces.runtime(target, too_long)
    assert refused.value.field == field
    assert _state() == before  # refused before anything was written

    surfaces.runtime(target, longest)  # accepted: the same limit, not only some limit


def _state() -> tuple[list[Any], list[Any]]:
    runs = list(WorkflowRun.objects.order_by("pk").values_list("pk", "status", "owner_epoch", "updated_at"))
    schedules = list(Schedule.objects.order_by("pk").values_list("pk", "note", "paused", "updated_at"))
    return runs, schedules


def test_a_negative_update_wait_is_refused_at_every_surface() -> None:
    rule = OPERATIONS["update"].wait
    assert rule is not None
    form = UpdateForm({"name": "approve", "payload": "", "wait": "-1"})
    assert "wait" in _refused_field(form)
    serializer = s.UpdateRequestSerializer(data={"name": "approve", "wait": -1})
    assert "wait" in _refused_key(serializer)
    run_id = _pending_run()
    with pytest.raises(InvalidInput) as refused:
        runtime.update(run_id, "approve", wait=-1)
    assert refused.value.field == "wait"
    for bad in (float("nan"), float("inf"), True, "soon"):
        with pytest.raises(InvalidInput):
            rule.check(bad)


def test_the_admin_update_wait_is_bounded_by_the_rest_setting(settings: Any) -> None:
    rule = OPERATIONS["update"].wait
    assert rule is not None
    settings.WEFT_API_MAX_WAIT = 4
    assert rule.surface_maximum == 4
    assert "wait" not in _refused_field(UpdateForm({"name": "approve", "payload": "", "wait": "4"}))
    form = UpdateForm({"name": "approve", "payload": "", "wait": "4.5"})
    assert "wait" in _refused_field(form) and "4" in " ".join(form.errors["wait"])
    assert rule.at_surface(60) == 4  # the REST API caps a longer wait (the contract says so)
    assert rule.check(60) == 60  # the Python client may wait longer


def test_a_backfill_of_more_than_the_limit_is_refused_in_python_too() -> None:
    handle = client.create_schedule("minutely", "tests.echo", args=[1], every="1m")
    start = datetime(2027, 1, 1, tzinfo=UTC)
    with pytest.raises(InvalidInput, match=f"more than {BACKFILL_LIMIT} scheduled times") as refused:
        handle.backfill(start, start + timedelta(minutes=BACKFILL_LIMIT))  # limit + 1 times
    assert refused.value.field == "end"
    assert WorkflowRun.objects.count() == 0


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_each_operation_names_permissions_that_exist(name: str) -> None:
    described = OPERATIONS[name]
    assert described.permissions
    for codename in described.permissions:
        assert Permission.objects.filter(content_type__app_label="django_weft", codename=codename).exists()


@pytest.mark.parametrize("priority", [START_PRIORITY.minimum, START_PRIORITY.maximum])
def test_the_ends_of_the_priority_range_are_taken_at_every_surface(priority: int) -> None:
    assert OPERATIONS["start"].priority is START_PRIORITY
    assert "priority" not in _refused_field(_start_form(priority))
    assert "priority" not in _refused_key(
        s.StartRunSerializer(data={"workflow": "tests.echo", "priority": priority})
    )
    assert (
        WorkflowRun.objects.get(pk=client.start("tests.echo", priority=priority).run_id).priority == priority
    )


@pytest.mark.parametrize("priority", [START_PRIORITY.minimum - 1, START_PRIORITY.maximum + 1])
def test_a_priority_past_the_range_is_refused_at_every_surface(priority: int) -> None:
    bounds = f"from {START_PRIORITY.minimum} to {START_PRIORITY.maximum}"
    form = _start_form(priority)
    assert "priority" in _refused_field(form)
    serializer = s.StartRunSerializer(data={"workflow": "tests.echo", "priority": priority})
    assert "priority" in _refused_key(serializer)
    assert bounds in str(serializer.errors["priority"][0])
    with pytest.raises(InvalidInput, match=bounds) as refused:
        client.start("tests.echo", priority=priority)
    assert refused.value.field == "priority"
    assert not WorkflowRun.objects.exists()


def _start_form(priority: int) -> forms.Form:
    return StartWorkflowForm({"workflow": "tests.echo", "on_conflict": "fail", "priority": str(priority)})
