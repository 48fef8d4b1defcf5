"""Retention on the database: which terminal runs ``purge_expired`` deletes (per status,
per workflow, the 30-day default, ``None``), which it keeps (a live parent or child, a
finalizer to run), what goes with them, dry runs, batches, ``weft_gc``, the sweep's
pass, schedules whose runs were purged, and (PostgreSQL) that live runs are never locked.
Age is set by moving ``updated_at`` into the past."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import OperationalError, close_old_connections, connection, transaction
from django.test import override_settings

from django_weft import client
from django_weft.engine.registry import registry, workflow
from django_weft.models import BulkJob, Schedule, Signal, Step, Timer, Update, WorkflowRun
from django_weft.runtime import fire_due_schedules, get_store, purge_expired, tick
from django_weft.runtime import sweep as sweep_module
from django_weft.testing import drive

pytestmark = pytest.mark.django_db(transaction=True)

SHORT = "tests.gc.short"  # kept one day
KEEP_FAILURES = "tests.gc.keep_failures"  # its failed runs forever, the rest as the setting says
LONG = "tests.gc.long"  # kept a year


@pytest.fixture(autouse=True, scope="module")
def _workflows_with_their_own_retention() -> Iterator[None]:
    for name, retention in ((SHORT, "1d"), (KEEP_FAILURES, {"failed": None}), (LONG, "365d")):
        workflow(name=name, retention=retention)(lambda ctx: None)
    yield
    for name in (SHORT, KEEP_FAILURES, LONG):
        registry.unregister(name)


def db_now() -> datetime:
    return get_store().db_now()


def make_run(
    status: str = "completed",
    age_days: float = 31,
    name: str = "tests.echo",
    parent: WorkflowRun | None = None,
    related: bool = False,
    **fields: Any,
) -> WorkflowRun:
    """A run of ``status`` last changed ``age_days`` ago; ``related`` adds a step, a timer,
    a signal and an update."""
    run = WorkflowRun.objects.create(
        workflow_id=f"gc-{uuid.uuid4()}", workflow_name=name, status=status, parent=parent, **fields
    )
    if related:
        moment = db_now()
        Step.objects.create(
            run=run, seq=0, kind="activity", name="tests.noop", status="completed", started_at=moment
        )
        Timer.objects.create(run=run, seq=1, kind="sleep", fire_at=moment, fired_at=moment)
        Signal.objects.create(run=run, name="go", consumed_seq=2)
        Update.objects.create(run=run, update_id="u1", name="bump", status="completed")
    WorkflowRun.objects.filter(pk=run.pk).update(updated_at=db_now() - timedelta(days=age_days))
    return run


def exists(*runs: WorkflowRun) -> list[bool]:
    present = set(WorkflowRun.objects.filter(pk__in=[r.pk for r in runs]).values_list("pk", flat=True))
    return [run.pk in present for run in runs]


def test_the_default_keeps_terminal_runs_30_days_and_never_touches_live_ones() -> None:
    old = [make_run(status, 31) for status in ("completed", "failed", "cancelled", "timed_out", "continued")]
    recent = [make_run(status, 29) for status in ("completed", "failed")]
    live = [make_run(status, 400) for status in ("pending", "running", "waiting", "suspended")]
    with override_settings():
        from django.conf import settings

        if hasattr(settings, "WEFT_RETENTION"):
            del settings.WEFT_RETENTION
        report = purge_expired()
    assert exists(*old) == [False] * 5
    assert exists(*recent, *live) == [True] * 6
    assert dict(report.purged) == dict.fromkeys(
        ["completed", "failed", "cancelled", "timed_out", "continued"], 1
    )


@override_settings(WEFT_RETENTION=None)
def test_none_keeps_finished_runs_forever() -> None:
    run = make_run("completed", 10_000)
    assert purge_expired().purged_total == 0
    assert exists(run) == [True]


@override_settings(WEFT_RETENTION={"completed": "7d", "failed": "90d"})
def test_per_status_periods_are_honoured_and_the_others_keep_30_days() -> None:
    completed_8, completed_6 = make_run("completed", 8), make_run("completed", 6)
    failed_8, failed_91 = make_run("failed", 8), make_run("failed", 91)
    cancelled_8, cancelled_31 = make_run("cancelled", 8), make_run("cancelled", 31)
    report = purge_expired()
    assert exists(completed_8, completed_6, failed_8, failed_91, cancelled_8, cancelled_31) == [
        False, True, True, False, True, False,
    ]  # fmt: skip
    assert dict(report.purged) == {"completed": 1, "failed": 1, "cancelled": 1}


@override_settings(WEFT_RETENTION={"completed": "7d", "failed": "90d"})
def test_per_workflow_periods_are_honoured() -> None:
    short = [make_run("completed", 2, SHORT), make_run("failed", 2, SHORT), make_run("completed", 0.5, SHORT)]
    keep_failures = [make_run("failed", 1000, KEEP_FAILURES), make_run("completed", 8, KEEP_FAILURES)]
    long = [make_run("completed", 300, LONG), make_run("failed", 366, LONG)]
    shared = [make_run("completed", 8), make_run("failed", 8)]
    report = purge_expired()
    assert exists(*short) == [False, False, True]
    assert exists(*keep_failures) == [True, False]  # its completed runs follow the setting
    assert exists(*long) == [True, False]
    assert exists(*shared) == [False, True]
    assert dict(report.purged) == {"completed": 3, "failed": 2}


@override_settings(WEFT_RETENTION="1d")
def test_a_run_with_a_live_child_or_parent_or_a_finalizer_to_run_is_kept() -> None:
    parent = make_run("completed", 5)
    live_child = make_run("waiting", 5, parent=parent)
    live_parent = make_run("running", 5)
    child = make_run("completed", 5, parent=live_parent)
    finalizing = make_run("timed_out", 5, finalizer={"status": "retrying", "attempt": 1})
    finalized = make_run("timed_out", 5, finalizer={"status": "completed", "attempt": 1})
    report = purge_expired()
    assert exists(parent, live_child, live_parent, child, finalizing, finalized) == [True] * 5 + [False]
    assert dict(report.kept) == {"live child": 1, "live parent": 1, "finalizer to run": 1}
    assert (
        report.batches[0].line()
        == "purged 1 timed_out; kept 3 (1 finalizer to run, 1 live child, 1 live parent)"
    )
    # Once the child has finished, the parent goes; the child (not due yet) loses its link.
    WorkflowRun.objects.filter(pk=live_child.pk).update(status="completed", updated_at=db_now())
    assert purge_expired().purged_total == 1
    assert exists(parent, live_child) == [False, True]
    assert WorkflowRun.objects.get(pk=live_child.pk).parent_id is None


@override_settings(WEFT_RETENTION="1d")
def test_steps_timers_signals_and_updates_go_with_their_run() -> None:
    handle = client.start("tests.ten_steps", args=["gc-related"])
    assert drive(handle.run_id) == "completed"
    run = WorkflowRun.objects.get(pk=handle.run_id)
    Signal.objects.create(run=run, name="late")
    Update.objects.create(run=run, update_id="late", name="bump", status="rejected")
    other = make_run("completed", 5, related=True)
    kept = make_run("completed", 0, related=True)
    assert Step.objects.filter(run=run).count() == 10
    WorkflowRun.objects.filter(pk=run.pk).update(updated_at=db_now() - timedelta(days=2))
    assert purge_expired().purged_total == 2  # run and other
    for model in (Step, Timer, Signal, Update):
        assert set(model.objects.values_list("run_id", flat=True)) == {kept.pk}, model
    assert not exists(run, other)[0]


@override_settings(WEFT_RETENTION="1d")
def test_batches_limits_and_kept_runs_that_do_not_stall_the_scan() -> None:
    parents = [make_run("completed", 10) for _ in range(5)]  # the oldest: read first
    for parent in parents:
        make_run("waiting", 1, parent=parent)
    due = [make_run("completed", 5) for _ in range(8)]
    limited = purge_expired(batch=3, limit=4)
    assert limited.purged_total == 4
    assert [b.purged.total() + b.kept.total() for b in limited.batches] == [3, 3, 3]
    capped = purge_expired(batch=3, max_batches=2)
    assert (len(capped.batches), capped.purged_total, capped.kept.total()) == (2, 1, 5)
    report = purge_expired(batch=3)
    assert report.purged_total == 3 and report.kept.total() == 5
    assert [b.line() for b in report.batches] == [
        "purged 0; kept 3 (3 live child)",
        "purged 1 completed; kept 2 (2 live child)",
        "purged 2 completed; kept 0",
    ]
    assert exists(*due) == [False] * 8 and exists(*parents) == [True] * 5


@override_settings(WEFT_RETENTION={"completed": "1d", "failed": "3d"})
def test_a_dry_run_deletes_nothing_and_reports_what_the_real_run_does() -> None:
    parent = make_run("failed", 10)
    make_run("running", 1, parent=parent)
    for _ in range(4):
        make_run("completed", 2)
    make_run("failed", 4, related=True)
    make_run("failed", 2)  # not due
    before = WorkflowRun.objects.count(), Step.objects.count()
    dry = purge_expired(batch=2, dry_run=True)
    assert (WorkflowRun.objects.count(), Step.objects.count()) == before
    real = purge_expired(batch=2)
    assert dry.purged == real.purged == {"completed": 4, "failed": 1}
    assert dry.kept == real.kept == {"live child": 1}
    assert [b.line().replace("would purge", "purged") for b in dry.batches] == [
        b.line() for b in real.batches
    ]
    assert dry.batches[0].line().startswith("would purge 2 completed")
    assert WorkflowRun.objects.count() == before[0] - 5


@override_settings(WEFT_RETENTION={"completed": "1d", "failed": "1d"})
def test_weft_gc_prints_a_line_per_batch_and_a_total() -> None:
    for _ in range(5):
        make_run("completed", 2)
    make_run("failed", 2)
    dry, out = StringIO(), StringIO()
    call_command("weft_gc", "--dry-run", "--batch", "2", stdout=dry)
    assert WorkflowRun.objects.count() == 6
    call_command("weft_gc", "--batch", "2", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[:3] == [
        "purged 2 completed; kept 0",
        "purged 2 completed; kept 0",
        "purged 1 completed, 1 failed; kept 0",
    ]
    assert lines[3].startswith("total: purged 6 (5 completed, 1 failed); kept 0 in 3 batches, ")
    assert dry.getvalue().splitlines()[0] == "would purge 2 completed; kept 0"
    assert WorkflowRun.objects.count() == 0
    quiet = StringIO()
    call_command("weft_gc", "--limit", "5", verbosity=0, stdout=quiet)
    assert quiet.getvalue() == ""


@pytest.mark.parametrize("option", [["--batch", "0"], ["--limit", "-1"], ["--batch", "many"]])
def test_weft_gc_refuses_a_bad_batch_or_limit(option: list[str]) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="must be a positive integer"):
        call_command("weft_gc", *option)


@override_settings(WEFT_RETENTION="1d", WEFT_TICK_BATCH=2)
def test_the_sweep_purges_at_most_once_a_minute_per_process_and_a_few_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sweep_module, "_last_purge", [0.0])
    monkeypatch.setattr(sweep_module, "PURGE_MAX_BATCHES", 2)
    due = [make_run("completed", 2 + n) for n in range(5)]
    assert tick().purged == 4  # two batches of two
    assert tick().purged == 0  # the next pass is a minute later
    assert exists(*due) == [True] + [False] * 4


@override_settings(WEFT_RETENTION="1d")
def test_a_schedule_whose_runs_were_purged_still_describes_and_fires() -> None:
    client.create_schedule("gc-hourly", "tests.echo", every="1h")
    Schedule.objects.filter(pk="gc-hourly").update(next_fire_at=db_now() - timedelta(seconds=1))
    assert fire_due_schedules(100) == 1
    (run,) = WorkflowRun.objects.filter(workflow_id__startswith="gc-hourly-")
    assert drive(str(run.pk)) == "completed"
    assert purge_expired(now=db_now() + timedelta(days=2)).purged_total == 1
    described = client.get_schedule_handle("gc-hourly").describe()
    assert described.recent_actions[0]["run_id"] == str(run.pk)
    assert described.recent_actions[0]["run_status"] is None
    # The purged run no longer blocks the overlap policy: the next fire starts a run.
    Schedule.objects.filter(pk="gc-hourly").update(next_fire_at=db_now() - timedelta(seconds=1))
    assert fire_due_schedules(100) == 1
    assert WorkflowRun.objects.filter(workflow_id__startswith="gc-hourly-").count() == 1


def test_the_celery_gc_task_purges(settings: Any) -> None:
    from django_weft.contrib.celery.tasks import gc

    settings.WEFT_RETENTION = "1d"
    make_run("completed", 2)
    assert gc() == {"purged": 1, "kept": 0}


# -- PostgreSQL: index use and locks -------------------------------------------------------


def test_due_pages_are_index_range_scans_of_the_terminal_partial_indexes(on_postgres: bool) -> None:
    """Each page of a due range reads a range of a partial index on terminal runs (status,
    updated_at; or workflow_name, status, updated_at), so it costs what is due, whatever
    else the table holds."""
    from django.test.utils import CaptureQueriesContext

    from django_weft.engine.retention import DueRange
    from django_weft.store import RetentionScan

    store = get_store()
    names = ["tests.echo", SHORT, LONG, "tests.countdown"]
    statuses = ["completed"] * 7 + ["failed", "cancelled", "running"]
    WorkflowRun.objects.bulk_create(
        WorkflowRun(workflow_id=f"gc-plan-{n}", workflow_name=names[n % 4], status=statuses[n % 10])
        for n in range(4000)
    )
    for n in range(60):  # last changed over the past 60 days, half of them due
        WorkflowRun.objects.filter(workflow_id__endswith=f"-{n}").update(
            updated_at=db_now() - timedelta(days=n)
        )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {WorkflowRun._meta.db_table}")
    now = db_now() - timedelta(days=30)
    for due, index in (
        (DueRange("completed", now, excluded=(LONG, SHORT)), "weft_run_terminal_updated"),
        (DueRange("failed", now, workflow=SHORT), "weft_run_terminal_name"),
    ):
        for after in (None, (now - timedelta(days=20), uuid.uuid4())):
            with CaptureQueriesContext(connection) as queries, transaction.atomic():
                store.retention._due_page(RetentionScan(due, after=after), 100, lock=True)
            (query,) = [q["sql"] for q in queries.captured_queries if "updated_at" in q["sql"]]
            with connection.cursor() as cursor:
                cursor.execute(("EXPLAIN " if on_postgres else "EXPLAIN QUERY PLAN ") + query)
                plan = "\n".join(str(row[0] if on_postgres else row[3]) for row in cursor.fetchall())
            if on_postgres:
                (condition,) = [line for line in plan.splitlines() if "Index Cond" in line]
                assert f" {index} " in plan and "Seq Scan" not in plan, plan
                assert "(status)::text = " in condition and "updated_at < " in condition, plan
            else:
                assert f"USING INDEX {index} (" in plan and "status=? AND " in plan, plan
                assert "updated_at<?)" in plan, plan


@pytest.mark.postgres
@override_settings(WEFT_RETENTION="1d")
def test_a_child_locked_elsewhere_keeps_its_parent_for_now() -> None:
    parent = make_run("completed", 5)
    child = make_run("failed", 0, parent=parent)  # not due itself
    locked, release = threading.Event(), threading.Event()

    def hold_the_child() -> None:
        try:
            with transaction.atomic():
                list(WorkflowRun.objects.select_for_update().filter(pk=child.pk).values_list("pk"))
                locked.set()
                release.wait(10)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_child)
    holder.start()
    try:
        assert locked.wait(10)
        started = time.monotonic()
        report = purge_expired()
        assert time.monotonic() - started < 5  # did not wait for the lock
        assert report.kept == {"live child": 1} and exists(parent) == [True]
    finally:
        release.set()
        holder.join(10)
    assert purge_expired().purged_total == 1
    assert WorkflowRun.objects.get(pk=child.pk).parent_id is None


@pytest.mark.postgres
@override_settings(WEFT_RETENTION="1d")
def test_gc_never_locks_a_live_run_and_holds_a_kept_parent_for_at_most_a_batch() -> None:
    """While gc deletes 3,000 due runs in batches of 100, another connection keeps taking
    the lock of live runs with NOWAIT (it never fails: gc never locks them) and of the
    kept parents of live children, waiting (as a child's completion waits for its parent):
    the longest wait stays within the longest batch."""
    parents = [make_run("completed", 3) for _ in range(20)]
    children = [make_run("waiting", 3, parent=p) for p in parents]
    live = [*children, *(make_run("running", 3) for _ in range(20))]
    rows = []
    old = db_now() - timedelta(days=2)
    for n in range(3000):
        rows.append(WorkflowRun(workflow_id=f"gc-bulk-{n}", workflow_name="tests.echo", status="completed"))
    WorkflowRun.objects.bulk_create(rows, batch_size=1000)
    WorkflowRun.objects.filter(workflow_id__startswith="gc-bulk-").update(updated_at=old)
    steps = [
        Step(run_id=row.pk, seq=seq, kind="activity", name="tests.noop", status="completed", started_at=old)
        for row in rows
        for seq in range(3)
    ]
    Step.objects.bulk_create(steps, batch_size=3000)
    stop = threading.Event()
    refused: list[str] = []
    parent_waits: list[float] = []

    def probe() -> None:
        live_ids = [run.pk for run in live]
        parent_ids = [run.pk for run in parents]
        try:
            while not stop.is_set():
                try:
                    with transaction.atomic():
                        list(
                            WorkflowRun.objects.select_for_update(nowait=True)
                            .filter(pk__in=live_ids)
                            .values_list("pk")
                        )
                except OperationalError as exc:
                    refused.append(str(exc))
                for pk in parent_ids[:5]:
                    started = time.perf_counter()
                    with transaction.atomic():
                        list(WorkflowRun.objects.select_for_update().filter(pk=pk).values_list("pk"))
                    parent_waits.append(time.perf_counter() - started)
        finally:
            close_old_connections()
            connection.close()

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        report = purge_expired(batch=100)
    finally:
        stop.set()
        prober.join(30)
    # A parent the probe holds at that moment is skipped (SKIP LOCKED), not counted as kept.
    assert report.purged_total == 3000 and set(report.kept) == {"live child"} and report.kept.total() <= 20
    assert len(report.batches) >= 30
    assert refused == []
    assert parent_waits, "the probe never ran"
    assert max(parent_waits) < report.longest_batch + 0.5, (max(parent_waits), report.longest_batch)
    assert exists(*live) == [True] * 40 and Step.objects.count() == 0


def make_bulk_job(status: str, finished_days_ago: float | None) -> BulkJob:
    moment = db_now()
    finished = None if finished_days_ago is None else moment - timedelta(days=finished_days_ago)
    return BulkJob.objects.create(
        action="cancel", runs_from="tests.unused", as_of=moment, status=status, finished_at=finished
    )


def bulk_jobs_left(*jobs: BulkJob) -> list[bool]:
    present = set(BulkJob.objects.filter(pk__in=[job.pk for job in jobs]).values_list("pk", flat=True))
    return [job.pk in present for job in jobs]


@override_settings(WEFT_RETENTION="30d")
def test_finished_bulk_jobs_go_after_the_longest_period_and_open_ones_stay() -> None:
    old = [make_bulk_job("completed", 31), make_bulk_job("failed", 31)]
    recent = make_bulk_job("completed", 29)
    open_jobs = [make_bulk_job("running", None), make_bulk_job("pending", None)]
    dry = purge_expired(dry_run=True)
    assert dry.bulk_jobs == 2
    assert "would purge 2 finished bulk jobs" in dry.summary()
    assert bulk_jobs_left(*old) == [True, True]
    report = purge_expired()
    assert report.bulk_jobs == 2
    assert bulk_jobs_left(*old, recent, *open_jobs) == [False, False, True, True, True]


@override_settings(WEFT_RETENTION={"completed": "7d", "failed": "90d"})
def test_bulk_jobs_are_kept_as_long_as_the_longest_retained_status() -> None:
    job = make_bulk_job("completed", 60)
    assert purge_expired().bulk_jobs == 0
    assert bulk_jobs_left(job) == [True]


@override_settings(WEFT_RETENTION={"failed": None})
def test_a_status_kept_forever_keeps_finished_bulk_jobs_forever() -> None:
    job = make_bulk_job("completed", 10_000)
    assert purge_expired().bulk_jobs == 0
    assert bulk_jobs_left(job) == [True]
