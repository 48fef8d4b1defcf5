"""Schedules declared in code: ``weft_schedules sync`` creates, updates, reports conflicts
and prunes; ``weft_schedules list`` shows them."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_weft import InvalidSchedule, client, schedule
from django_weft.engine.registry import registry
from django_weft.models import Schedule
from django_weft.runtime import sync_schedules
from tests.support.threads import in_threads

pytestmark = pytest.mark.django_db(transaction=True)

DECLARED = "tests-nightly-report"


@pytest.fixture
def redeclare() -> Iterator[object]:
    """Replace the test workflow's declared schedules for one test."""
    original = registry.workflows["tests.scheduled_report"]

    def set_schedules(*declarations: object) -> None:
        registry.workflows["tests.scheduled_report"] = dataclasses.replace(
            original, schedules=tuple(declarations)
        )

    yield set_schedules
    registry.workflows["tests.scheduled_report"] = original


def run(*args: str) -> str:
    out = StringIO()
    call_command("weft_schedules", *args, stdout=out, stderr=out)
    return out.getvalue()


def test_sync_creates_then_leaves_alone() -> None:
    assert f"{DECLARED}: created" in run("sync")
    created = Schedule.objects.get(pk=DECLARED)
    assert created.managed and created.cron == "0 2 * * *" and created.timezone == "Europe/Oslo"
    assert created.args == ["nightly"] and created.next_fire_at is not None
    assert "0 created, 0 updated, 1 unchanged" in run("sync")
    assert Schedule.objects.get(pk=DECLARED).updated_at == created.updated_at


def test_sync_updates_a_changed_declaration_and_keeps_pausing(redeclare) -> None:  # type: ignore[no-untyped-def]
    run("sync")
    client.get_schedule_handle(DECLARED).pause("holiday")
    redeclare(schedule(DECLARED, cron="30 3 * * *", timezone="Europe/Oslo", overlap="buffer_one"))
    output = run("sync")
    assert f"{DECLARED}: updated (args, cron, overlap)" in output
    updated = Schedule.objects.get(pk=DECLARED)
    assert updated.cron == "30 3 * * *" and updated.overlap == "buffer_one" and updated.args == []
    assert updated.paused and updated.note == "holiday"  # the operators' choice stays


def test_dry_run_writes_nothing(redeclare) -> None:  # type: ignore[no-untyped-def]
    assert f"{DECLARED}: would be created" in run("sync", "--dry-run")
    assert not Schedule.objects.exists()


def test_a_hand_made_schedule_with_that_id_is_a_conflict_left_alone() -> None:
    client.create_schedule(DECLARED, "tests.echo", every="1h")
    output = run("sync")
    assert "made by hand" in output and "1 conflicts" in output
    kept = Schedule.objects.get(pk=DECLARED)
    assert kept.workflow_name == "tests.echo" and not kept.managed


def test_prune_deletes_managed_schedules_no_longer_declared(redeclare) -> None:  # type: ignore[no-untyped-def]
    run("sync")
    client.create_schedule("by-hand", "tests.echo", every="1h")
    redeclare()
    assert ": deleted" not in run("sync")
    assert Schedule.objects.filter(pk=DECLARED).exists()  # without --prune it stays
    assert f"{DECLARED}: deleted" in run("sync", "--prune")
    assert list(Schedule.objects.values_list("pk", flat=True)) == ["by-hand"]


def test_bad_declarations() -> None:
    with pytest.raises(InvalidSchedule):
        schedule("x", cron="every day")
    with pytest.raises(InvalidSchedule):
        schedule("x", every="1h", overlap="never")


def test_a_declaration_for_arguments_the_workflow_does_not_take_fails_the_sync(redeclare) -> None:  # type: ignore[no-untyped-def]
    redeclare(schedule(DECLARED, every="1h", args=[1, 2, 3]))
    with pytest.raises(CommandError, match="arguments"):
        run("sync")
    assert not Schedule.objects.exists()


def test_list() -> None:
    assert run("list").strip() == "no schedules"
    run("sync")
    client.create_schedule("paused-one", "tests.echo", every="1h", paused=True, note="later")
    lines = run("list").splitlines()
    assert lines[0].startswith("paused-one  tests.echo  every 1h") and "paused (later)" in lines[0]
    assert lines[1].startswith(f"{DECLARED}  tests.scheduled_report  cron '0 2 * * *' in Europe/Oslo")
    assert lines[1].endswith("[managed]")


def test_sync_is_the_runtime_function() -> None:
    report = sync_schedules(dry_run=True)
    assert report.created == [DECLARED]


@pytest.mark.postgres
def test_two_syncs_at_once_create_a_missing_schedule_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_weft.store.schedules import ScheduleRows

    both_read = threading.Barrier(2)
    read = ScheduleRows.lock_schedules

    def read_then_meet(self: ScheduleRows, schedule_ids: list[str]) -> list[Schedule]:
        found = read(self, schedule_ids)
        with contextlib.suppress(threading.BrokenBarrierError):
            both_read.wait(1)  # two deploys read "missing" together, unless one waits for the other
        return found

    monkeypatch.setattr(ScheduleRows, "lock_schedules", read_then_meet)
    reports = in_threads(lambda _: sync_schedules(), 2, timeout=30, return_exceptions=True)
    assert sorted(sorted(r.created) for r in reports) == [[], [DECLARED]], reports  # type: ignore[attr-defined]
    assert Schedule.objects.filter(pk=DECLARED).count() == 1
