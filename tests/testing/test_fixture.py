"""The ``weft`` fixture: runs driven in the test's transaction on a virtual clock
(PostgreSQL and SQLite)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from django_weft import (
    UnknownHandler,
    WorkflowCancelled,
    WorkflowFailed,
    WorkflowNotRegistered,
    WorkflowTimedOut,
    client,
)
from django_weft.engine import activity_overrides, clock
from django_weft.models import Step, Timer, WorkflowRun
from django_weft.runtime import get_store
from django_weft.runtime.dispatch import get_dispatcher
from django_weft.testing import WeftBusy, WeftTestEnvironment, make_engine
from tests.testapp.models import SideEffect

from . import workflows as wf

DAY = timedelta(days=1)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


# -- the clock --------------------------------------------------------------------------------


def test_a_thirty_day_sleep_passes_in_virtual_time_while_the_wall_clock_barely_moves(weft) -> None:
    began, wall = weft.now(), time.monotonic()
    run = weft.start(wf.sleeper, "30d")
    assert run.status() == "waiting"
    weft.advance("29d 23h 59m")
    assert run.status() == "waiting"
    weft.advance("1m")
    assert run.status() == "completed"
    assert run.result() == {"before": _iso(began), "after": _iso(began + 30 * DAY)}
    assert weft.now() == began + 30 * DAY
    assert time.monotonic() - wall < 30  # virtual days, real seconds at most


def test_the_clock_stands_still_until_advanced(weft) -> None:
    first = weft.now()
    run = weft.start(wf.now)
    assert run.result() == _iso(first)
    assert weft.now() == first
    assert weft.advance(timedelta(hours=2)) == first + timedelta(hours=2)


def test_advance_stops_at_every_due_time_on_the_way(weft) -> None:
    began = weft.now()
    run = weft.start(wf.two_sleeps)
    weft.advance("3d")
    # Each sleep woke at its own time, not at the end of the span.
    assert run.result() == [_iso(began + DAY), _iso(began + 2 * DAY)]
    assert weft.now() == began + 3 * DAY


def test_the_store_reads_and_writes_the_virtual_time(weft) -> None:
    began = weft.now()
    store = get_store()
    assert store.db_now() == began
    run = weft.start(wf.sleeper, "1h")
    timer = Timer.objects.get(run_id=run.run_id)
    assert timer.fire_at == began + timedelta(hours=1)
    row = WorkflowRun.objects.get(pk=run.run_id)
    assert row.claimed_at == began and row.updated_at == began
    weft.advance("1h")
    row.refresh_from_db()
    assert row.finished_at == began + timedelta(hours=1)
    assert Timer.objects.get(run_id=run.run_id).fired_at == began + timedelta(hours=1)


@pytest.mark.parametrize("weft_start_time", [datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)])
def test_weft_start_time_pins_the_date(weft) -> None:
    assert weft.now() == datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    assert weft.start(wf.now).result() == "2031-05-06T07:08:09+00:00"


def test_leaving_the_environment_restores_real_time_and_the_dispatcher(db: None) -> None:
    before = get_dispatcher()
    with WeftTestEnvironment(start=datetime(2040, 1, 1, tzinfo=UTC)) as weft:
        assert clock.installed() is weft.clock
        assert get_store().db_now() == datetime(2040, 1, 1, tzinfo=UTC)
        assert type(get_dispatcher()).__name__ == "SweepOnlyDispatcher"
        weft.mock_activity(wf.note, return_value="mocked")
        assert activity_overrides.body_of(wf.note) is not wf.note.fn
    assert clock.installed() is None
    assert get_dispatcher() is before
    assert activity_overrides.body_of(wf.note) is wf.note.fn
    assert abs(get_store().db_now() - datetime.now(UTC)) < timedelta(minutes=5)


def test_a_second_clock_in_the_same_test_is_refused(weft) -> None:
    with pytest.raises(RuntimeError, match="installed already"), WeftTestEnvironment():
        pass
    assert clock.installed() is weft.clock


# -- signals, updates, queries ----------------------------------------------------------------


def test_a_signal_before_the_timeout_decides(weft) -> None:
    run = weft.start(wf.approval, 7)
    weft.advance("6d")
    assert weft.update(run, "add_note", "checked stock") == 1
    assert weft.query(run, "state") == {"order": 7, "notes": ["checked stock"]}
    weft.signal(run, "decision", {"by": "ann", "approved": True})
    result = run.result()
    assert result["decision"] == {"by": "ann", "approved": True}
    assert result["decided_at"] == _iso(weft.now())


def test_without_a_signal_the_timeout_decides_after_seven_days(weft) -> None:
    began = weft.now()
    run = weft.start(wf.approval, 8)
    weft.advance("7d")
    assert run.result()["decision"] == {"by": None, "approved": False}
    assert run.result()["decided_at"] == _iso(began + 7 * DAY)


def test_update_and_query_errors_come_back_as_the_client_raises_them(weft) -> None:
    run = weft.start(wf.approval, 9)
    with pytest.raises(UnknownHandler):
        weft.update(run, "no_such_update", 1)
    with pytest.raises(UnknownHandler):
        weft.query(run, "no_such_query")
    # By workflow id, as the client takes it.
    assert weft.query(run.workflow_id, "state")["order"] == 9


def test_history_lists_the_recorded_steps(weft) -> None:
    run = weft.start(wf.approval, 10, id="order-10")
    weft.signal(run, "decision", {"by": "bo", "approved": True})
    kinds = [(entry["kind"], entry["name"]) for entry in weft.history(run)]
    assert ("signal", "decision") in kinds
    assert run.workflow_id == "order-10"


# -- timeouts, retries, schedules, leases --------------------------------------------------


def test_an_execution_timeout_times_the_run_out(weft) -> None:
    run = client.start(wf.approval, args=[11], execution_timeout="2d")
    weft.run_until_idle()
    assert run.status() == "waiting"
    weft.advance("2d")
    assert run.status() == "timed_out"
    with pytest.raises(WorkflowTimedOut):
        run.result()


def test_a_retry_an_hour_later_follows_the_activity_policy(weft) -> None:
    attempts: list[str] = []

    def supplier(item: str) -> int:
        attempts.append(_iso(weft.now()))
        if len(attempts) == 1:
            raise ConnectionError("the supplier is down")
        return 120

    began = weft.now()
    mock = weft.mock_activity(wf.quote, side_effect=supplier)
    run = weft.start(wf.priced, "bolts")
    assert run.status() == "waiting"
    weft.advance("59m")
    assert len(attempts) == 1
    weft.advance("1m")
    assert run.result() == 120
    assert attempts == [_iso(began), _iso(began + timedelta(hours=1))]
    assert mock.calls == [(("bolts",), {}), (("bolts",), {})]
    step = Step.objects.get(run_id=run.run_id, name="tests.testing.quote")
    assert (step.status, step.attempt, step.result) == ("completed", 2, 120)


def test_an_exception_side_effect_fails_every_attempt_through_the_retry_policy(weft) -> None:
    mock = weft.mock_activity("tests.testing.quote", side_effect=ConnectionError("refused"))
    run = weft.start(wf.priced, "nuts")
    weft.advance("1h")
    assert mock.call_count == 2 and run.status() == "waiting"
    weft.advance("2h")  # backoff 2: the third attempt two hours after the second
    assert mock.call_count == 3
    with pytest.raises(WorkflowFailed) as failed:
        run.result()
    assert "ConnectionError" in str(failed.value) and "refused" in str(failed.value)
    assert not SideEffect.objects.filter(key__startswith="quote:nuts").exists()


def test_an_inline_retry_delay_moves_the_virtual_clock_not_the_thread(weft) -> None:
    calls = []

    def flaky(key: str) -> str:
        calls.append(key)
        if len(calls) < 3:
            raise ValueError("not yet")
        return key.upper()

    weft.mock_activity(wf.quick_retry, side_effect=flaky)
    began, wall = weft.now(), time.monotonic()
    run = weft.start(wf.quick, "k")
    # Two failed attempts, each followed by a 1 s delay slept inside the turn.
    assert run.result() == {"value": "K", "waited": 2.0}
    assert weft.now() == began + timedelta(seconds=2)
    assert time.monotonic() - wall < 30


def test_a_schedule_fires_at_each_of_its_times(weft) -> None:
    began = weft.now()
    schedule = client.create_schedule("hourly-price-check", wf.priced, args=["screws"], every="1h")
    weft.mock_activity(wf.quote, return_value=90)
    upcoming = schedule.describe(next_count=3).next_fire_times
    weft.advance("3h")
    runs = list(
        WorkflowRun.objects.filter(search_attributes__weft_schedule_id="hourly-price-check")
        .order_by("created_at")
        .values_list("status", "search_attributes")
    )
    assert [status for status, _ in runs] == ["completed"] * 3
    fired = [datetime.fromisoformat(attrs["weft_scheduled_at"].replace("Z", "+00:00")) for _, attrs in runs]
    assert fired == upcoming
    assert all(began < moment <= began + timedelta(hours=3) for moment in fired)
    assert schedule.describe().fired == 3


def test_an_expired_lease_is_taken_over_after_its_grace_and_the_old_owner_is_fenced_out(weft) -> None:
    from django.conf import settings

    run = client.start(wf.now)
    crashed = make_engine("crashed-worker")
    claimed = crashed.store.claim(run.run_id, crashed.engine_id, settings.WEFT_LEASE_TTL, 0.5)
    assert claimed is not None
    weft.run_until_idle()
    assert run.status() == "running"  # owned: nobody else may drive it
    lease_end = weft.now() + timedelta(seconds=settings.WEFT_LEASE_TTL)
    weft.advance(settings.WEFT_LEASE_TTL + settings.WEFT_TAKEOVER_GRACE + 1)
    # Taken over at the first moment past expiry + grace, as a sweep would.
    result = datetime.fromisoformat(run.result())
    assert lease_end + timedelta(seconds=settings.WEFT_TAKEOVER_GRACE) < result
    assert result <= lease_end + timedelta(seconds=settings.WEFT_TAKEOVER_GRACE, milliseconds=1)
    from django_weft.engine.errors import Deposed
    from django_weft.engine.records import StepKind, StepStatus, StepWrite

    late = StepWrite(
        seq=0, kind=StepKind.SIDE_EFFECT, name="late", status=StepStatus.COMPLETED, args_json=None,
        result_json="1", error_json=None, attempt=1, started_at=weft.now(), finished_at=weft.now(),
    )  # fmt: skip
    with pytest.raises(Deposed):
        crashed.store.commit_step(run.run_id, crashed.engine_id, claimed.epoch, late)


# -- activities ---------------------------------------------------------------------------


def test_a_mocked_activity_is_recorded_like_the_real_one_and_replays(weft) -> None:
    mock = weft.mock_activity(wf.quote, return_value=75)
    run = weft.start(wf.approval, 12)
    priced = weft.start(wf.priced, "washers")
    assert priced.result() == 75
    entry = next(e for e in weft.history(priced) if e["name"] == "tests.testing.quote")
    assert (entry["status"], entry["result"], entry["args"]) == (
        "completed", 75, {"args": ["washers"], "kwargs": {}},
    )  # fmt: skip
    assert mock.call_count == 1
    # The real activity never ran.
    assert not SideEffect.objects.filter(key__startswith="quote:").exists()
    assert run.status() == "waiting"


def test_a_mocked_step_is_replayed_from_the_history_in_later_turns(weft) -> None:
    mock = weft.mock_activity(wf.note, side_effect=lambda key: f"mocked {key}")
    run = weft.start(wf.two_sleeps)
    weft.advance("2d")
    assert run.status() == "completed"
    # Turn 2 replayed the first note from the history; the mock ran once per note.
    assert [args for args, _ in mock.calls] == [("two_sleeps:1",), ("two_sleeps:2",)]
    notes = [e["result"] for e in weft.history(run) if e["name"] == "tests.testing.note"]
    assert notes == ["mocked two_sleeps:1", "mocked two_sleeps:2"]


def test_a_queued_activity_runs_in_the_test_thread(weft) -> None:
    run = weft.start(wf.mailer, "ann@example.com")
    assert run.result() == "sent to ann@example.com"
    mock = weft.mock_activity("tests.testing.mail", return_value="queued mock")
    assert weft.start(wf.mailer, "bo@example.com").result() == "queued mock"
    assert mock.calls == [(("bo@example.com",), {})]


def test_mock_activity_refuses_what_it_cannot_do(weft) -> None:
    with pytest.raises(LookupError, match=r"no activity named 'tests\.testing\.nope'"):
        weft.mock_activity("tests.testing.nope", return_value=1)
    with pytest.raises(TypeError, match="not both"):
        weft.mock_activity(wf.note, return_value=1, side_effect=ValueError)
    with pytest.raises(TypeError, match="callable or an exception"):
        weft.mock_activity(wf.note, side_effect=42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="@activity object"):
        weft.mock_activity(wf.sleeper, return_value=1)  # type: ignore[arg-type]


# -- the rest ---------------------------------------------------------------------------------


def test_start_takes_a_registered_name_and_refuses_an_unknown_one(weft) -> None:
    assert weft.start("tests.testing.now").status() == "completed"
    with pytest.raises(WorkflowNotRegistered):
        weft.start("tests.testing.no_such_workflow")


def test_cancel_and_its_outcome(weft) -> None:
    run = weft.start(wf.approval, 13)
    run.cancel(reason="customer left")
    weft.run_until_idle()
    with pytest.raises(WorkflowCancelled):
        run.result()


def test_a_workflow_that_never_waits_is_reported_busy(weft) -> None:
    weft.max_turns = 5
    client.start("tests.countdown", args=[50])
    with pytest.raises(WeftBusy, match="still busy"):
        weft.run_until_idle()


@pytest.mark.django_db(transaction=True)
def test_the_fixture_works_with_transactional_db(weft) -> None:
    run = weft.start(wf.approval, 14)
    weft.advance("7d")
    assert run.status() == "completed"


def test_more_due_timers_than_a_sweep_batch_all_fire(weft, settings) -> None:
    settings.WEFT_TICK_BATCH = 2
    runs = [weft.start(wf.sleeper, "1h") for _ in range(5)]
    weft.advance("1h")
    assert [run.status() for run in runs] == ["completed"] * 5


def test_a_renewed_lease_runs_from_the_virtual_time_and_holds_off_a_takeover(weft, settings) -> None:
    run = client.start(wf.now)
    owner = make_engine("slow-worker")
    claimed = owner.store.claim(run.run_id, owner.engine_id, settings.WEFT_LEASE_TTL, 0.5)
    assert claimed is not None
    weft.advance(settings.WEFT_LEASE_TTL - 1)
    renewal = owner.store.renew(owner.engine_id, {run.run_id: claimed.epoch}, settings.WEFT_LEASE_TTL)
    assert renewal.lost == set()
    row = WorkflowRun.objects.get(pk=run.run_id)
    assert row.lease_expires_at == weft.now() + timedelta(seconds=settings.WEFT_LEASE_TTL)
    # Past the first lease and its grace, within the renewed one: still the owner's.
    weft.advance(settings.WEFT_LEASE_TTL)
    row.refresh_from_db()
    assert (row.owner_id, row.status) == ("slow-worker", "running")
    weft.advance(settings.WEFT_TAKEOVER_GRACE + 1)
    assert run.status() == "completed"


# -- flow control ---------------------------------------------------------------------------------


def test_attempts_held_by_a_rate_limit_go_at_their_moments_in_virtual_time(weft) -> None:
    # tests.per_account: one attempt per 10 s for each account.
    first = weft.start("tests.af.one", "per_account", "v1", account="a")
    second = weft.start("tests.af.one", "per_account", "v2", account="a")
    other = weft.start("tests.af.one", "per_account", "v3", account="b")
    assert (first.status(), second.status(), other.status()) == ("completed", "waiting", "completed")
    weft.advance("9s")
    assert second.status() == "waiting"
    weft.advance("1s")
    assert second.status() == "completed"
    assert SideEffect.objects.filter(key__startswith="account:a:").count() == 2
