"""Schedules on the database: create and check, the tick's fires (idempotent), catch-up,
each overlap policy with a run that outlives the interval, pause/unpause/trigger/
update/delete/backfill. Time passes by moving ``next_fire_at`` into the past."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from django_weft import (
    InvalidSchedule,
    ScheduleAlreadyExists,
    ScheduleManaged,
    ScheduleNotFound,
    WorkflowArgumentsError,
    WorkflowNotRegistered,
    client,
    runtime,
)
from django_weft.engine.registry import registry
from django_weft.engine.schedule_firing import MAX_MISSED_PER_TICK
from django_weft.models import Schedule, WorkflowRun
from django_weft.runtime import fire_due_schedules, get_store
from django_weft.testing import drive

pytestmark = pytest.mark.django_db(transaction=True)

LONG = "tests.m.wait_with_timeout"  # waits for signal "go": outlives any interval here


def now() -> datetime:
    return get_store().db_now()


def runs_of(schedule_id: str) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(workflow_id__startswith=f"{schedule_id}-").order_by("created_at"))


def come_due(schedule_id: str, ago: float = 0.5) -> datetime:
    """Move the schedule's next fire into the past by ``ago`` seconds (as if time passed)."""
    moment = (now() - timedelta(seconds=ago)).replace(microsecond=0)
    Schedule.objects.filter(pk=schedule_id).update(next_fire_at=moment)
    return moment


def test_create_computes_the_first_fire_and_describe_shows_it() -> None:
    handle = client.create_schedule("hourly", "tests.echo", args=[1], every="1h", offset="5m")
    schedule = Schedule.objects.get(pk="hourly")
    assert schedule.workflow_name == "tests.echo" and schedule.args == [1]
    assert schedule.next_fire_at is not None and schedule.next_fire_at > now()
    assert schedule.next_fire_at.minute == 5 and schedule.next_fire_at.second == 0
    described = handle.describe(next_count=3)
    assert described.spec == "every 1h at +5m"
    assert [t - described.next_fire_times[0] for t in described.next_fire_times] == [
        timedelta(0), timedelta(hours=1), timedelta(hours=2)
    ]  # fmt: skip
    assert described.fired == described.skipped == described.missed == 0


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"cron": "61 * * * *"}, InvalidSchedule),
        ({"cron": "* * * * *", "timezone": "Nowhere/City"}, InvalidSchedule),
        ({}, InvalidSchedule),
        ({"cron": "* * * * *", "every": 60}, InvalidSchedule),
        (
            {
                "every": 60,
                "start_at": datetime(2027, 2, 1, tzinfo=UTC),
                "end_at": datetime(2027, 1, 1, tzinfo=UTC),
            },
            InvalidSchedule,
        ),
        ({"every": 60, "overlap": "sometimes"}, InvalidSchedule),
        ({"every": 60, "catchup_window": "forever"}, InvalidSchedule),
        ({"every": 60, "catchup_window": 0}, InvalidSchedule),  # every fire would count as missed
        ({"cron": "R R * * *"}, InvalidSchedule),  # a value drawn anew at every reading
        ({"cron": f"{','.join(map(str, range(60)))} {','.join(map(str, range(24)))} * * *"}, InvalidSchedule),
        ({"every": 60, "search_attributes": {"weft_schedule_id": "x"}}, InvalidSchedule),
        ({"every": 60, "workflow": "tests.nope"}, WorkflowNotRegistered),
        ({"every": 60, "workflow": "tests.countdown"}, WorkflowArgumentsError),  # n missing
    ],
)
def test_bad_input_raises_and_writes_nothing(options: dict[str, Any], error: type[Exception]) -> None:
    workflow = options.pop("workflow", "tests.echo")
    with pytest.raises(error):
        client.create_schedule("bad", workflow, **options)
    assert not Schedule.objects.exists()


def test_bad_input_names_the_option_at_fault() -> None:
    for options, field in [
        ({"every": 60, "note": "a\x00b"}, "note"),
        ({"every": 60, "args": ["\ud800"]}, "args"),
        ({"every": 60, "kwargs": {"x": "\x00"}}, "kwargs"),
        ({"every": 60, "catchup_window": -1}, "catchup_window"),
        ({"every": 60, "overlap": "never"}, "overlap"),
        ({"cron": "nope"}, "cron"),
    ]:
        with pytest.raises(InvalidSchedule) as caught:
            client.create_schedule("fields", "tests.echo", **options)
        assert caught.value.field == field, options
    with pytest.raises(InvalidSchedule) as caught:
        client.create_schedule("has space", "tests.echo", every=60)
    assert caught.value.field == "id"
    assert not Schedule.objects.exists()
    handle = client.create_schedule("noted", "tests.echo", every=60)
    for change in (handle.pause, handle.unpause, lambda note: handle.update(note=note)):
        with pytest.raises(InvalidSchedule) as caught:
            change("a\x00b")
        assert caught.value.field == "note"
    assert Schedule.objects.get(pk="noted").note == ""


def test_bad_ids_and_a_taken_id() -> None:
    for bad in ["", "has space", "-lead", "x" * 201, 7]:
        with pytest.raises(InvalidSchedule):
            client.create_schedule(bad, "tests.echo", every=60)  # type: ignore[arg-type]
    client.create_schedule("taken", "tests.echo", every=60)
    with pytest.raises(ScheduleAlreadyExists):
        client.create_schedule("taken", "tests.echo", every=120)
    assert Schedule.objects.get(pk="taken").every_seconds == 60
    with pytest.raises(ScheduleNotFound):
        client.get_schedule_handle("missing")


def test_a_due_fire_starts_one_run_with_its_id_and_attributes() -> None:
    client.create_schedule(
        "nightly", "tests.echo", args=["report"], every="1h", search_attributes={"team": "ops"}
    )
    scheduled = come_due("nightly")
    assert fire_due_schedules(100) == 1
    (run,) = runs_of("nightly")
    assert run.workflow_id == f"nightly-{scheduled:%Y-%m-%dT%H:%M:%SZ}"
    assert run.search_attributes == {
        "team": "ops",
        "weft_schedule_id": "nightly",
        "weft_scheduled_at": scheduled.isoformat().replace("+00:00", "Z"),
    }
    schedule = Schedule.objects.get(pk="nightly")
    assert schedule.fired_count == 1 and schedule.next_fire_at > now()
    assert schedule.recent_actions[0]["outcome"] == "started"
    assert schedule.recent_actions[0]["run_id"] == str(run.pk)
    assert fire_due_schedules(100) == 0  # nothing due any more
    drive(str(run.pk))
    described = client.get_schedule_handle("nightly").describe()
    assert described.recent_actions[0]["run_status"] == "completed"


def test_a_fire_repeated_after_a_lost_advance_starts_nothing_new() -> None:
    """As if a process started the run and died before the schedule row moved on."""
    client.create_schedule("again", "tests.echo", every="1h", overlap="allow_all")
    scheduled = come_due("again")
    fire_due_schedules(100)
    Schedule.objects.filter(pk="again").update(next_fire_at=scheduled, latest_workflow_id="")
    fire_due_schedules(100)
    assert len(runs_of("again")) == 1
    schedule = Schedule.objects.get(pk="again")
    assert schedule.fired_count == 1
    assert schedule.recent_actions[0]["outcome"] == "already_started"


def test_catch_up_starts_fires_inside_the_window_and_counts_older_ones() -> None:
    client.create_schedule("catchup", "tests.echo", every="1m", catchup_window="5m", overlap="allow_all")
    # Nothing ticked for 10 minutes.
    base = come_due("catchup", ago=600)
    fire_due_schedules(100)
    schedule = Schedule.objects.get(pk="catchup")
    started = runs_of("catchup")
    assert 5 <= len(started) <= 6  # the fires of the last five minutes (and now)
    assert schedule.missed_count == 11 - len(started)
    assert schedule.last_missed_at is not None and schedule.last_missed_at < base + timedelta(minutes=6)
    assert schedule.fired_count == len(started)


def test_a_cron_schedule_far_behind_counts_its_missed_fires_over_ticks_then_fires() -> None:
    """A week of a per-minute cron missed: each tick counts at most MAX_MISSED_PER_TICK in its
    short transaction and leaves the schedule due; the one that gets through starts the fire."""
    client.create_schedule("behind", "tests.echo", cron="* * * * *", overlap="allow_all")
    start = come_due("behind", ago=7 * 86400).replace(second=0) + timedelta(minutes=1)
    Schedule.objects.filter(pk="behind").update(next_fire_at=start)
    ticks = 0
    while not runs_of("behind"):
        fire_due_schedules(100)
        ticks += 1
        assert ticks <= 5
    schedule = Schedule.objects.get(pk="behind")
    assert ticks == -(-schedule.missed_count // MAX_MISSED_PER_TICK) and ticks > 1
    assert abs(schedule.missed_count - 7 * 1440) <= 2  # each minute of the week, bar the last one or two
    assert schedule.next_fire_at is not None and schedule.next_fire_at > now()
    (missed,) = [action for action in schedule.recent_actions if action["outcome"] == "missed"]  # one action
    assert missed["detail"] == f"{schedule.missed_count} fire(s) older than the catch-up window"
    assert missed["scheduled_at"] == schedule.last_missed_at.isoformat().replace("+00:00", "Z")


def test_a_schedule_left_due_by_its_tick_waits_for_the_next_one_and_the_others_go_first() -> None:
    """Batches of one: the schedule a week behind is counted once in this call (its first
    5,000 missed times), then the schedule due on time fires in the same call."""
    client.create_schedule("behind", "tests.echo", cron="* * * * *", overlap="allow_all")
    client.create_schedule("ontime", "tests.echo", every="1h", overlap="allow_all")
    come_due("behind", ago=7 * 86400)
    come_due("ontime")
    assert fire_due_schedules(1) == 2
    assert Schedule.objects.get(pk="behind").missed_count == MAX_MISSED_PER_TICK and not runs_of("behind")
    assert len(runs_of("ontime")) == 1
    assert fire_due_schedules(1) == 1  # the next tick goes on counting
    assert Schedule.objects.get(pk="behind").missed_count == 2 * MAX_MISSED_PER_TICK


def test_a_catch_up_paused_in_the_middle_and_a_later_one_are_two_actions() -> None:
    handle = client.create_schedule("twice", "tests.echo", cron="* * * * *", overlap="allow_all")
    come_due("twice", ago=7 * 86400)
    fire_due_schedules(100)  # counting, still due
    handle.pause()
    handle.unpause()
    come_due("twice", ago=2 * 86400)  # down again, later
    fire_due_schedules(100)
    missed = [a for a in Schedule.objects.get(pk="twice").recent_actions if a["outcome"] == "missed"]
    assert len(missed) == 2 and missed[1]["count"] == MAX_MISSED_PER_TICK  # two actions, not one summed
    assert abs(missed[0]["count"] - 2 * 1440) <= 1  # the later outage's own


def _open_run_and_next_fire(schedule_id: str, overlap: str) -> tuple[WorkflowRun, WorkflowRun | None]:
    """Two hourly fires come due at once (the last full hour and the one before); the
    first one's run waits for a signal, so it is still open at the second."""
    client.create_schedule(schedule_id, LONG, args=[3600], every="1h", overlap=overlap, catchup_window="1d")
    hour = now().replace(minute=0, second=0, microsecond=0)
    Schedule.objects.filter(pk=schedule_id).update(next_fire_at=hour - timedelta(hours=1))
    fire_due_schedules(100)
    runs = runs_of(schedule_id)
    assert len(runs) <= 2
    return runs[0], runs[1] if len(runs) > 1 else None


def next_hour_due(schedule_id: str) -> None:
    """The next hourly fire comes due (as if an hour passed). In the first second of an
    hour, "now" would name the same fire as the full hour already fired (one run id, so
    no new run): the moment steps back a second then."""
    moment = now().replace(microsecond=0)
    if moment.minute == moment.second == 0:
        moment -= timedelta(seconds=1)
    Schedule.objects.filter(pk=schedule_id).update(next_fire_at=moment)


def test_overlap_skip() -> None:
    _first, second = _open_run_and_next_fire("o-skip", "skip")
    assert second is None
    schedule = Schedule.objects.get(pk="o-skip")
    assert schedule.skipped_count >= 1 and schedule.fired_count == 1
    assert schedule.recent_actions[0]["outcome"] == "skipped"


def test_overlap_buffer_one_starts_the_buffered_fire_when_the_run_finishes() -> None:
    first, second = _open_run_and_next_fire("o-buf1", "buffer_one")
    assert second is None
    schedule = Schedule.objects.get(pk="o-buf1")
    assert schedule.buffered_count == 1  # the second fire waits; a third is skipped
    next_hour_due("o-buf1")
    fire_due_schedules(100)
    schedule.refresh_from_db()
    assert schedule.buffered_count == 1 and schedule.skipped_count == 1
    client.get_handle(str(first.pk)).cancel("done")
    fire_due_schedules(100)
    runs = runs_of("o-buf1")
    assert len(runs) == 2
    schedule.refresh_from_db()
    assert schedule.buffered_count == 0 and schedule.recent_actions[0]["source"] == "buffer"


def test_overlap_buffer_all_starts_them_one_after_another() -> None:
    _first, _ = _open_run_and_next_fire("o-bufall", "buffer_all")
    next_hour_due("o-bufall")
    fire_due_schedules(100)
    assert Schedule.objects.get(pk="o-bufall").buffered_count == 2
    for expected in (2, 3):
        client.get_handle(str(runs_of("o-bufall")[-1].pk)).cancel("done")
        fire_due_schedules(100)
        assert len(runs_of("o-bufall")) == expected
    assert Schedule.objects.get(pk="o-bufall").buffered_count == 0


def test_overlap_terminate_other() -> None:
    first, second = _open_run_and_next_fire("o-terminate", "terminate_other")
    assert second is not None
    first.refresh_from_db()
    assert first.status == "cancelled" and second.status != "cancelled"


def test_overlap_cancel_other_asks_the_open_run_to_cancel_and_starts_once_it_has() -> None:
    first, second = _open_run_and_next_fire("o-cancel", "cancel_other")
    assert second is None
    first.refresh_from_db()
    assert first.status != "cancelled" and first.cancel_request is not None  # asked, not ended
    schedule = Schedule.objects.get(pk="o-cancel")
    assert schedule.buffered_count == 1 and schedule.recent_actions[0]["outcome"] == "buffered"
    assert drive(str(first.pk)) == "cancelled"  # it received the request where it waited
    fire_due_schedules(100)
    runs = runs_of("o-cancel")
    assert [r.pk for r in runs[:1]] == [first.pk] and len(runs) == 2
    assert Schedule.objects.get(pk="o-cancel").buffered_count == 0


def test_overlap_allow_all() -> None:
    first, second = _open_run_and_next_fire("o-all", "allow_all")
    assert second is not None
    assert {first.status, second.status} <= {"running", "pending", "waiting"}


def test_pause_unpause() -> None:
    handle = client.create_schedule("p", "tests.echo", every="1h")
    come_due("p")
    handle.pause("maintenance")
    assert fire_due_schedules(100) == 0
    assert handle.describe().paused and handle.describe().note == "maintenance"
    assert handle.describe().next_fire_times == []
    handle.unpause()
    schedule = Schedule.objects.get(pk="p")
    assert not schedule.paused and schedule.next_fire_at > now()  # the paused-over fire is dropped
    assert runs_of("p") == []


def test_a_process_without_the_schedules_workflow_leaves_its_fire_due() -> None:
    handle = client.create_schedule("elsewhere", "tests.echo", every="1h")
    due = come_due("elsewhere")
    echo = registry.workflows.pop("tests.echo")  # this process has no code for it (an older deploy)
    try:
        assert fire_due_schedules(100) == 0
    finally:
        registry.workflows["tests.echo"] = echo
    schedule = Schedule.objects.get(pk="elsewhere")
    assert (schedule.next_fire_at, schedule.recent_actions) == (due, [])  # not fired, not lost
    assert fire_due_schedules(100) == 1  # a process that has it
    assert [a["outcome"] for a in handle.describe().recent_actions] == ["started"]


def test_a_schedule_whose_fire_fails_holds_up_no_other() -> None:
    client.create_schedule("broken", "tests.echo", cron="0 * * * *", timezone="Europe/Oslo")
    client.create_schedule("sound", "tests.echo", every="1h")
    broken_due, _ = come_due("broken", ago=2), come_due("sound")
    # A time zone this process's tz database does not know (written by a newer one).
    Schedule.objects.filter(pk="broken").update(timezone="Europe/Atlantis")
    assert fire_due_schedules(100) == 1
    assert len(runs_of("sound")) == 1 and runs_of("broken") == []
    broken = Schedule.objects.get(pk="broken")
    assert (broken.next_fire_at, broken.recent_actions) == (broken_due, [])  # left due, as it was


def test_unpausing_a_schedule_that_is_not_paused_changes_nothing() -> None:
    handle = client.create_schedule("up", "tests.echo", every="1h", note="kept")
    due = come_due("up")
    handle.unpause()
    schedule = Schedule.objects.get(pk="up")
    assert (schedule.next_fire_at, schedule.note) == (due, "kept")
    fire_due_schedules(100)
    assert len(runs_of("up")) == 1  # the due fire was not dropped


def test_trigger_fires_now_honouring_or_overriding_overlap() -> None:
    handle = client.create_schedule("t", LONG, args=[3600], every="1d")
    action = handle.trigger()
    assert action["outcome"] == "started"
    assert handle.trigger()["outcome"] in {"skipped", "already_started"}  # the first is still open
    Schedule.objects.filter(pk="t").update(recent_actions=[])
    forced = handle.trigger(overlap="allow_all")
    assert forced["outcome"] in {"started", "already_started"}  # same second: same workflow id


def test_update_takes_effect_from_the_next_fire() -> None:
    handle = client.create_schedule("u", "tests.echo", every="1h")
    handle.update(cron="0 9 * * *", timezone="Europe/Oslo", overlap="allow_all", args=[2])
    schedule = Schedule.objects.get(pk="u")
    assert schedule.cron == "0 9 * * *" and schedule.every_seconds is None
    assert schedule.overlap == "allow_all" and schedule.args == [2]
    assert schedule.next_fire_at.astimezone(ZoneInfo("Europe/Oslo")).hour == 9
    before = Schedule.objects.get(pk="u").updated_at
    with pytest.raises(InvalidSchedule):
        handle.update(cron="nope")
    with pytest.raises(InvalidSchedule):
        handle.update(colour="red")
    assert Schedule.objects.get(pk="u").updated_at == before  # nothing written


def test_delete_keeps_the_runs() -> None:
    handle = client.create_schedule("d", "tests.echo", every="1h")
    handle.trigger()
    handle.delete()
    assert not Schedule.objects.filter(pk="d").exists()
    assert len(runs_of("d")) == 1
    with pytest.raises(ScheduleNotFound):
        handle.delete()


def test_backfill_fires_each_time_once_and_twice_is_a_no_op() -> None:
    handle = client.create_schedule("b", "tests.echo", every="1h")
    start, end = datetime(2027, 1, 1, tzinfo=UTC), datetime(2027, 1, 1, 5, tzinfo=UTC)
    actions = handle.backfill(start, end)
    assert [a["outcome"] for a in actions] == ["started"] * 6
    assert handle.backfill(start, end) and len(runs_of("b")) == 6
    assert {a["outcome"] for a in handle.backfill(start, end)} == {"already_started"}
    assert sorted(r.workflow_id for r in runs_of("b"))[0] == "b-2027-01-01T00:00:00Z"
    with pytest.raises(InvalidSchedule):
        handle.backfill(end, start)
    with pytest.raises(InvalidSchedule):
        handle.backfill(datetime(2027, 1, 1), end)
    assert Schedule.objects.get(pk="b").fired_count == 6


def test_a_backfill_beside_an_open_run_leaves_the_overlap_policy_to_that_run() -> None:
    first, _ = _open_run_and_next_fire("o-backfill", "skip")
    # An earlier time backfilled (allowed to overlap), and one whose run is there already.
    hour = now().replace(minute=0, second=0, microsecond=0)
    handle = client.get_schedule_handle("o-backfill")
    backfilled = handle.backfill(hour - timedelta(hours=30), hour - timedelta(hours=30), overlap="allow_all")
    assert [a["outcome"] for a in backfilled] == ["started"]
    client.get_handle(backfilled[0]["run_id"]).cancel("done")
    again = handle.backfill(hour - timedelta(hours=30), hour - timedelta(hours=30))
    assert [a["outcome"] for a in again] == ["already_started"]
    # The next fire still finds the first run open, and skips.
    next_hour_due("o-backfill")
    fire_due_schedules(100)
    first.refresh_from_db()
    assert first.status in ("running", "waiting", "pending")
    open_runs = [r for r in runs_of("o-backfill") if r.status in ("running", "waiting", "pending")]
    assert open_runs == [first]
    assert Schedule.objects.get(pk="o-backfill").recent_actions[0]["outcome"] == "skipped"


def test_a_tick_ends_with_more_blocked_buffers_than_a_batch() -> None:
    for index in range(5):
        _open_run_and_next_fire(f"blocked-{index}", "buffer_all")
    assert Schedule.objects.filter(buffered_count__gt=0).count() == 5
    assert fire_due_schedules(2) == 0  # every run still open: nothing to start, and it returns


def test_the_workflow_sees_its_schedule_and_scheduled_time() -> None:
    client.create_schedule("seen", "tests.schedule_info", every="1h")
    scheduled = come_due("seen")
    fire_due_schedules(100)
    (run,) = runs_of("seen")
    drive(str(run.pk))
    run.refresh_from_db()
    assert run.result == {"schedule_id": "seen", "scheduled_at": scheduled.isoformat()}
    plain = client.start("tests.schedule_info")
    drive(plain.run_id)
    assert WorkflowRun.objects.get(pk=plain.run_id).result == {"schedule_id": None, "scheduled_at": None}


def test_describe_gives_the_options_too() -> None:
    client.create_schedule(
        "options", "tests.echo", args=[1], kwargs={"k": 2}, cron="0 9 * * *", timezone="Europe/Oslo",
        jitter="30s", start_at=datetime(2027, 1, 1, tzinfo=UTC), search_attributes={"team": "ops"},
    )  # fmt: skip
    described = client.get_schedule_handle("options").describe(next_count=2)
    assert (described.args, described.kwargs, described.search_attributes) == ([1], {"k": 2}, {"team": "ops"})
    assert (described.cron, described.every, described.offset) == ("0 9 * * *", None, 0.0)
    assert (described.timezone, described.jitter, described.end_at) == ("Europe/Oslo", 30.0, None)
    assert described.start_at == datetime(2027, 1, 1, tzinfo=UTC)
    assert described.next_fire_at == described.next_fire_times[0] and len(described.next_fire_times) == 2
    assert described.created_at <= described.updated_at
    assert client.get_schedule_handle("options").describe(next_count=0).next_fire_times == []


def test_describe_schedules_reads_the_statuses_of_all_their_runs_at_once(
    django_assert_num_queries: Any,
) -> None:
    for name in ("one", "two", "three"):
        client.create_schedule(name, "tests.echo", every="1h").trigger()
    rows = list(Schedule.objects.order_by("pk"))
    with django_assert_num_queries(1):
        described = runtime.describe_schedules(rows)
    assert [d.id for d in described] == ["one", "three", "two"]
    assert all(d.recent_actions[0]["run_status"] for d in described)


def test_operators_change_only_the_note_of_a_schedule_declared_in_code() -> None:
    client.create_schedule("declared", "tests.echo", every="1h")
    Schedule.objects.filter(pk="declared").update(managed=True)
    before = Schedule.objects.get(pk="declared").updated_at
    for changes in (
        {"every": "2h"},
        {"args": [1], "note": "x"},
        {"workflow": "tests.sleepy"},
        {"managed": False},
    ):
        with pytest.raises(ScheduleManaged) as caught:
            runtime.update_schedule("declared", refuse_managed=True, **changes)
        assert caught.value.declared == sorted(set(changes) - {"note"})
        assert "weft_schedules sync" in str(caught.value)
    with pytest.raises(ScheduleManaged):
        runtime.delete_schedule("declared", refuse_managed=True)
    assert Schedule.objects.get(pk="declared").updated_at == before  # nothing written
    runtime.update_schedule("declared", refuse_managed=True, note="looked at it")
    assert Schedule.objects.get(pk="declared").note == "looked at it"
    runtime.update_schedule("declared", every="2h")  # code (the sync) may
    assert Schedule.objects.get(pk="declared").every_seconds == 7200
    runtime.delete_schedule("declared")
    assert not Schedule.objects.exists()
