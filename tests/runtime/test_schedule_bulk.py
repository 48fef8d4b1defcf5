"""An operation on many schedules (:mod:`django_weft.runtime.schedule_bulk`): which
schedules each operation skips and why, each schedule through its own runtime call, a
schedule deleted meanwhile skipped, and what a trigger fired."""

from __future__ import annotations

import pytest

from django_weft import InvalidInput, client, runtime
from django_weft.models import Schedule
from django_weft.runtime.schedule_bulk import DELETED_MEANWHILE

pytestmark = pytest.mark.django_db(transaction=True)


def _schedules(*ids: str) -> list[Schedule]:
    return list(Schedule.objects.filter(pk__in=ids).order_by("pk"))


def test_refusal_says_why_an_operation_leaves_a_schedule_alone() -> None:
    client.create_schedule("active", "tests.echo", every="1h")
    client.create_schedule("held", "tests.echo", every="1h").pause()
    Schedule.objects.filter(pk="held").update(managed=True)
    active, held = Schedule.objects.get(pk="active"), Schedule.objects.get(pk="held")

    assert runtime.schedule_refusal_for("pause", held) == "already paused"
    assert runtime.schedule_refusal_for("pause", active) is None
    assert runtime.schedule_refusal_for("unpause", active) == "not paused"
    assert runtime.schedule_refusal_for("unpause", held) is None
    assert runtime.schedule_refusal_for("trigger", held) is None  # paused schedules can be triggered
    assert runtime.schedule_refusal_for("delete", held) == "declared in code (workflow tests.echo)"
    assert runtime.schedule_refusal_for("delete", active) is None
    with pytest.raises(InvalidInput, match="unknown schedule operation 'archive'"):
        runtime.schedule_refusal_for("archive", active)


def test_pause_changes_the_active_ones_and_skips_the_paused_with_the_reason() -> None:
    client.create_schedule("a", "tests.echo", every="1h")
    client.create_schedule("b", "tests.echo", every="1h").pause()

    outcome = runtime.apply_schedule_bulk("pause", _schedules("a", "b"), note="maintenance")

    assert [schedule.pk for schedule in outcome.changed] == ["a"]
    assert outcome.skipped == {"already paused": ["b"]}
    assert outcome.failed == [] and outcome.fires == {}
    assert Schedule.objects.get(pk="a").note == "maintenance"


def test_delete_skips_code_declared_and_vanished_schedules() -> None:
    client.create_schedule("keep", "tests.echo", every="1h")
    client.create_schedule("gone", "tests.echo", every="1h")
    client.create_schedule("drop", "tests.echo", every="1h")
    Schedule.objects.filter(pk="keep").update(managed=True)
    listed = _schedules("drop", "gone", "keep")
    Schedule.objects.filter(pk="gone").delete()  # deleted after it was read

    outcome = runtime.apply_schedule_bulk("delete", listed)

    assert [schedule.pk for schedule in outcome.changed] == ["drop"]
    assert outcome.skipped == {
        DELETED_MEANWHILE: ["gone"],
        "declared in code (workflow tests.echo)": ["keep"],
    }
    assert list(Schedule.objects.values_list("pk", flat=True)) == ["keep"]


def test_trigger_records_what_each_fire_did() -> None:
    client.create_schedule("t1", "tests.echo", every="1d")
    client.create_schedule("t2", "tests.echo", every="1d").pause()

    outcome = runtime.apply_schedule_bulk("trigger", _schedules("t1", "t2"), overlap="allow_all")

    assert sorted(schedule.pk for schedule in outcome.changed) == ["t1", "t2"]
    assert {sid: fire["outcome"] for sid, fire in outcome.fires.items()} == {"t1": "started", "t2": "started"}
