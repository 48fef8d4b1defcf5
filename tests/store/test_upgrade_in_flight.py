"""Runs in flight across an upgrade: the database is migrated back to the first schema,
runs are left there mid-way as the code of that time left them (rows written with the
historical models of that migration state, values in that time's encoding), the
database is migrated to the latest schema, and the current code completes every run.

Later kinds of wait are put in flight at the first schema that could hold them: a run
waiting on a signal at 0005 (``ctx.wait_signal`` came with it), a schedule at 0009.
"""

from __future__ import annotations

import itertools
import re
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.apps.registry import Apps
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from django_weft import client
from django_weft.engine.errors import Deposed
from django_weft.engine.records import ACTIVE_STATUSES, StepWrite
from django_weft.models import Schedule, Signal, Timer, WorkflowRun
from django_weft.runtime import tick
from django_weft.runtime.dispatch import SweepOnlyDispatcher
from django_weft.store import DjangoStore
from django_weft.testing import make_engine
from tests.testapp import upgrade_workflows
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

FIRST = ("django_weft", "0001_initial")
SIGNALS = ("django_weft", "0005_message_step_kinds")
SCHEDULES = ("django_weft", "0009_schedule")
BEFORE_DEADLINE_TIMERS = ("django_weft", "0016_bulk_job_run_source_names")
DEADLINE_TIMERS = ("django_weft", "0017_deadline_timers_for_earlier_runs")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "upgrade.md"
ROW = re.compile(
    r"^\| `(?P<name>\d{4}_\w+)` \| [^|]+ \| (?P<verdict>yes|no)(?:: (?P<reason>[^|]+))? \|$", re.M
)

OLD_OWNER = "worker-before-upgrade"
OLD_EPOCH = 2


@pytest.fixture
def migrate_to() -> Iterator[Callable[[tuple[str, str]], Apps]]:
    """Migrate django_weft to a migration and return that state's historical models; the
    latest schema is restored afterwards, whatever the test did."""

    def migrate(target: tuple[str, str]) -> Apps:
        executor = MigrationExecutor(connection)
        executor.migrate([target])
        return executor.loader.project_state([target]).apps

    yield migrate
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes("django_weft"))


def _iso(moment: datetime) -> str:
    return moment.isoformat()


def _first_schema_runs(apps: Apps, now: datetime) -> dict[str, str]:
    """Runs in flight as the code of migration 0001 left them; returns name -> run id."""
    run_model = apps.get_model("django_weft", "WorkflowRun")
    step_model = apps.get_model("django_weft", "Step")
    timer_model = apps.get_model("django_weft", "Timer")
    past = now - timedelta(seconds=30)
    earlier = now - timedelta(minutes=5)

    def run(name: str, workflow: str, args: list[Any], **fields: Any) -> Any:
        fields.setdefault("status", "waiting")
        fields.setdefault("owner_epoch", 1)
        return run_model.objects.create(
            id=uuid.uuid4(), workflow_id=name, workflow_name=workflow, args=args, kwargs={}, **fields
        )

    def activity_done(target: Any, seq: int, activity: str, args: list[Any], result: Any) -> None:
        step_model.objects.create(
            run=target,
            seq=seq,
            kind="activity",
            name=activity,
            status="completed",
            args={"args": args, "kwargs": {}},
            result=result,
            attempt=1,
            started_at=earlier,
            finished_at=earlier,
        )
        SideEffect.objects.create(key=args[0])  # the activity ran, before the upgrade

    # Parked on a durable sleep whose timer came due while the upgrade ran.
    sleeping = run(
        "sleeping",
        "tests.upgrade.sleeper",
        ["sleeping"],
        waiting_on={"kind": "sleep", "seq": 1, "fire_at": _iso(past)},
    )
    activity_done(sleeping, 0, "tests.upgrade.step", ["sleeping:before", "before"], "before")
    step_model.objects.create(
        run=sleeping,
        seq=1,
        kind="sleep",
        name="sleep",
        status="waiting",
        result={"fire_at": _iso(past)},
        started_at=earlier,
    )
    timer_model.objects.create(run=sleeping, seq=1, kind="sleep", fire_at=past)

    # An activity attempt failed; the next one waits for its retry timer.
    retrying = run(
        "retrying",
        "tests.upgrade.retrier",
        ["retrying"],
        waiting_on={"kind": "retry", "seq": 0, "activity": "tests.upgrade.second_try", "fire_at": _iso(past)},
    )
    step_model.objects.create(
        run=retrying,
        seq=0,
        kind="activity",
        name="tests.upgrade.second_try",
        status="retrying",
        args={"args": ["retrying"], "kwargs": {}},
        result={"retry_at": _iso(past)},
        error={"type": "ConnectionError", "message": "first attempt", "traceback": "Traceback ...\n"},
        attempt=1,
        started_at=earlier,
    )
    timer_model.objects.create(run=retrying, seq=0, kind="retry", fire_at=past)
    SideEffect.objects.create(key="retrying")

    # Started with start_delay: pending until its delayed-start timer fires.
    delayed = run(
        "delayed", "tests.upgrade.greeting", ["delayed start"], status="pending", owner_epoch=0, ready_at=None
    )
    timer_model.objects.create(run=delayed, seq=-1, kind="delayed_start", fire_at=past)

    # Started with an execution_timeout: migration 0001's code stored the deadline on the
    # run and wrote no timer for it. It passed while the upgrade ran.
    overdue = run(
        "overdue",
        "tests.upgrade.sleeper",
        ["overdue"],
        execution_deadline=past,
        waiting_on={"kind": "sleep", "seq": 1, "fire_at": _iso(now + timedelta(hours=1))},
    )
    activity_done(overdue, 0, "tests.upgrade.step", ["overdue:before", "before"], "before")
    step_model.objects.create(
        run=overdue,
        seq=1,
        kind="sleep",
        name="sleep",
        status="waiting",
        result={"fire_at": _iso(now + timedelta(hours=1))},
        started_at=earlier,
    )
    timer_model.objects.create(run=overdue, seq=1, kind="sleep", fire_at=now + timedelta(hours=1))

    # Owned by a worker of the old code that stopped during the upgrade: its lease ran out.
    orphaned = run(
        "orphaned",
        "tests.upgrade.three_steps",
        ["orphaned"],
        status="running",
        owner_id=OLD_OWNER,
        owner_epoch=OLD_EPOCH,
        lease_expires_at=past,
        claimed_at=earlier,
        ready_at=earlier,
    )
    activity_done(orphaned, 0, "tests.upgrade.step", ["orphaned:0", 0], 0)

    return {
        name: str(row.pk)
        for name, row in [
            ("sleeping", sleeping),
            ("retrying", retrying),
            ("delayed", delayed),
            ("overdue", overdue),
            ("orphaned", orphaned),
        ]
    }


def _signal_schema_run(apps: Apps) -> str:
    """A run parked on ``ctx.wait_signal("approve")`` as migration 0005's code parked it,
    with a signal for its next wait already buffered."""
    run_model = apps.get_model("django_weft", "WorkflowRun")
    step_model = apps.get_model("django_weft", "Step")
    signal_model = apps.get_model("django_weft", "Signal")
    parked = run_model.objects.create(
        id=uuid.uuid4(),
        workflow_id="approval",
        workflow_name="tests.upgrade.approval",
        status="waiting",
        owner_epoch=1,
        waiting_on={"kind": "signal", "seq": 0, "name": "approve", "signals": ["approve"]},
    )
    step_model.objects.create(
        run=parked,
        seq=0,
        kind="signal",
        name="approve",
        status="waiting",
        result={"fire_at": None},
        started_at=timezone.now() - timedelta(minutes=5),
    )
    signal_model.objects.create(run=parked, name="note", payload={"sent": "before the upgrade"})
    return str(parked.pk)


def _schedule_schema_schedule(apps: Apps, now: datetime) -> datetime:
    """An hourly schedule whose fire came due while the upgrade ran; returns that fire."""
    due = now.replace(minute=0, second=0, microsecond=0)
    apps.get_model("django_weft", "Schedule").objects.create(
        id="hourly-greeting",
        workflow_name="tests.upgrade.greeting",
        args=["schedule"],
        every_seconds=3600.0,
        catchup_window_seconds=7200.0,
        next_fire_at=due,
    )
    return due


def _drive(done: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """The current code's sweep and turns, in this thread, until ``done()``."""
    engine = make_engine("worker-after-upgrade")
    sweep = SweepOnlyDispatcher()
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() >= deadline:
            active = list(
                WorkflowRun.objects.filter(status__in=ACTIVE_STATUSES).values_list("workflow_id", "status")
            )
            raise AssertionError(f"still waiting after {timeout} s until {what}; active runs: {active}")
        tick(sweep)
        for run_id in WorkflowRun.objects.filter(status__in=ACTIVE_STATUSES).values_list("pk", flat=True):
            engine.run_turn(str(run_id))
        time.sleep(0.02)


def _runs_of(effect_key: str) -> int:
    return SideEffect.objects.filter(key=effect_key).count()


def test_runs_in_flight_at_the_first_schema_complete_after_migrating_to_the_latest(
    migrate_to: Callable[[tuple[str, str]], Apps],
) -> None:
    assert upgrade_workflows.sleeper.name == "tests.upgrade.sleeper"  # registered
    now = timezone.now()
    runs = _first_schema_runs(migrate_to(FIRST), now)
    runs["approval"] = _signal_schema_run(migrate_to(SIGNALS))
    fire = _schedule_schema_schedule(migrate_to(SCHEDULES), now)
    latest = MigrationExecutor(connection)
    latest.migrate(latest.loader.graph.leaf_nodes("django_weft"))

    client.get_handle(runs["approval"]).signal("approve", {"sent": "after the upgrade"})
    schedule = Schedule.objects.get(pk="hourly-greeting")
    _drive(
        lambda: (
            not WorkflowRun.objects.filter(status__in=ACTIVE_STATUSES).exists()
            and Schedule.objects.get(pk=schedule.pk).fired_count == 1
        ),
        "every run in flight has finished and the schedule has fired",
    )

    def outcome(name: str) -> tuple[str, Any]:
        run = WorkflowRun.objects.get(pk=runs[name])
        return run.status, run.result

    assert outcome("sleeping") == ("completed", ["before", "after"])
    assert (_runs_of("sleeping:before"), _runs_of("sleeping:after")) == (1, 1)
    assert outcome("retrying") == ("completed", {"key": "retrying", "attempt": 2})
    assert _runs_of("retrying") == 2  # the failed first attempt, then the second
    assert outcome("delayed") == ("completed", "hello delayed start")
    assert outcome("orphaned") == ("completed", [0, 1, 2])
    assert [_runs_of(f"orphaned:{i}") for i in range(3)] == [1, 1, 1]
    assert outcome("approval") == (
        "completed",
        [{"sent": "after the upgrade"}, {"sent": "before the upgrade"}],
    )
    assert sorted(Signal.objects.filter(run_id=runs["approval"]).values_list("name", "consumed_seq")) == [
        ("approve", 0),
        ("note", 1),
    ]

    # The execution timeout stored by the first schema's code still holds.
    overdue = WorkflowRun.objects.get(pk=runs["overdue"])
    assert (overdue.status, overdue.failure_category) == ("timed_out", "timeout")
    assert _runs_of("overdue:after") == 0

    schedule.refresh_from_db()
    assert (schedule.fired_count, schedule.missed_count) == (1, 0)
    assert schedule.next_fire_at == fire + timedelta(hours=1)
    scheduled = WorkflowRun.objects.get(workflow_id=schedule.latest_workflow_id)
    assert (scheduled.status, scheduled.result) == ("completed", "hello schedule")

    # The worker that owned a run before the upgrade is fenced out: the run was taken over
    # at a later epoch, so a late write of the old owner is refused.
    orphaned = WorkflowRun.objects.get(pk=runs["orphaned"])
    assert orphaned.owner_epoch > OLD_EPOCH
    moment = timezone.now()
    late = StepWrite(1, "activity", "tests.upgrade.step", "completed", None, "1", None, 1, moment, moment)
    with pytest.raises(Deposed):
        DjangoStore().turns.commit_step(runs["orphaned"], OLD_OWNER, OLD_EPOCH, late)
    assert not Timer.objects.filter(fired_at__isnull=True).exists()


def test_the_deadline_migration_adds_a_timer_only_to_active_runs_that_lack_one(
    migrate_to: Callable[[tuple[str, str]], Apps],
) -> None:
    apps = migrate_to(BEFORE_DEADLINE_TIMERS)
    run_model, timer_model = (
        apps.get_model("django_weft", "WorkflowRun"),
        apps.get_model("django_weft", "Timer"),
    )
    deadline = timezone.now() + timedelta(hours=1)
    later = deadline + timedelta(hours=1)

    def run(name: str, status: str, execution_deadline: datetime | None) -> str:
        row = run_model.objects.create(
            id=uuid.uuid4(),
            workflow_id=name,
            workflow_name="tests.upgrade.greeting",
            status=status,
            execution_deadline=execution_deadline,
        )
        return str(row.pk)

    without_timer = {status: run(f"bare-{status}", status, deadline) for status in sorted(ACTIVE_STATUSES)}
    with_timer = run("with-timer", "waiting", deadline)
    timer_model.objects.create(run_id=with_timer, seq=-1, kind="deadline", fire_at=later)
    finished = run("finished", "completed", deadline)
    unbounded = run("unbounded", "waiting", None)

    def deadline_timers() -> dict[str, list[datetime]]:
        found: dict[str, list[datetime]] = {}
        for run_id, seq, fire_at in Timer.objects.filter(kind="deadline").values_list(
            "run_id", "seq", "fire_at"
        ):
            assert seq == -1
            found.setdefault(str(run_id), []).append(fire_at)
        return found

    expected = {**{run_id: [deadline] for run_id in without_timer.values()}, with_timer: [later]}
    migrate_to(DEADLINE_TIMERS)
    assert deadline_timers() == expected
    assert finished not in deadline_timers() and unbounded not in deadline_timers()

    # Reversed, the timers stay (the earlier schemas hold them); applied again, none is added twice.
    migrate_to(BEFORE_DEADLINE_TIMERS)
    assert deadline_timers() == expected
    migrate_to(DEADLINE_TIMERS)
    assert deadline_timers() == expected


def test_every_migration_is_reversible_and_applies_again_after_it_was_reversed(
    migrate_to: Callable[[tuple[str, str]], Apps],
) -> None:
    executor = MigrationExecutor(connection)
    irreversible = [
        f"{name}: {operation.describe()}"
        for (app, name), migration in executor.loader.disk_migrations.items()
        if app == "django_weft"
        for operation in migration.operations
        if not operation.reversible
    ]
    assert irreversible == []
    table = WorkflowRun._meta.db_table
    executor.migrate([("django_weft", None)])
    assert table not in connection.introspection.table_names()
    latest = MigrationExecutor(connection)
    latest.migrate(latest.loader.graph.leaf_nodes("django_weft"))
    assert table in connection.introspection.table_names()
    handle = client.start("tests.upgrade.greeting", args=["again"])
    _drive(lambda: handle.status() == "completed", "a run started on the re-created tables completes")
    assert handle.result() == "hello again"


def _documented() -> dict[str, tuple[str, str]]:
    """The upgrade page's table: migration -> (may the previous version keep running, why not)."""
    rows = {m["name"]: (m["verdict"], (m["reason"] or "").strip()) for m in ROW.finditer(PAGE.read_text())}
    assert rows, f"no migration table found in {PAGE}"
    return rows


def _migrations_in_order() -> list[str]:
    graph = MigrationExecutor(connection).loader.graph
    return [
        name for app, name in graph.forwards_plan(graph.leaf_nodes("django_weft")[0]) if app == "django_weft"
    ]


class _RolledBack(Exception):
    pass


def _writes_as(apps: Apps) -> bool:
    """Whether the models of ``apps`` (the code of that schema) can start a run, record its
    step and timer, store a signal and an update, and take an activity slot (once there
    are slots) in the database as it is now; every row is rolled back."""
    model = lambda name: apps.get_model("django_weft", name)  # noqa: E731
    now = timezone.now()
    try:
        with transaction.atomic():
            run = model("WorkflowRun").objects.create(
                id=uuid.uuid4(), workflow_id="written-by-old-code", workflow_name="tests.upgrade.greeting"
            )
            model("Step").objects.create(
                run=run, seq=0, kind="activity", name="a", status="completed", result=1, started_at=now
            )
            model("Timer").objects.create(run=run, seq=1, kind="sleep", fire_at=now)
            model("Signal").objects.create(run=run, name="s", payload=1)
            model("Update").objects.create(run=run, update_id="u", name="u", payload=1)
            if "activityslot" in apps.all_models["django_weft"]:
                model("ActivitySlot").objects.create(
                    activity="a", run=run, seq=0, state="held", lease_expires_at=now, created_at=now
                )
            raise _RolledBack
    except _RolledBack:
        return True
    except IntegrityError:
        return False


def test_the_upgrade_page_lists_every_migration_and_says_why_one_is_unsafe() -> None:
    documented = _documented()
    assert sorted(documented) == sorted(_migrations_in_order())
    assert [name for name, (verdict, reason) in documented.items() if verdict == "no" and not reason] == []


def test_the_previous_schemas_code_keeps_writing_across_each_migration_the_upgrade_page_calls_safe(
    migrate_to: Callable[[tuple[str, str]], Apps],
) -> None:
    documented = _documented()
    names = _migrations_in_order()
    migrate_to(("django_weft", names[0]))
    wrong = []
    for previous, name in itertools.pairwise(names):
        old_code = MigrationExecutor(connection).loader.project_state([("django_weft", previous)]).apps
        migrate_to(("django_weft", name))
        verdict, reason = documented[name]
        writes = _writes_as(old_code)
        # "yes": the previous schema's code writes; a "no" blamed on a NOT NULL column: it cannot.
        if (verdict == "yes" and not writes) or ("NOT NULL" in reason and writes):
            wrong.append(
                f"{name}: the page says {verdict!r}, the previous code {'can' if writes else 'cannot'} write"
            )
    assert wrong == []
