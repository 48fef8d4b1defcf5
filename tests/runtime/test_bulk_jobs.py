"""Bulk jobs (``runtime.start_bulk_job`` and ``process_bulk_jobs``): stored at once, worked
through by the tick a batch at a time with ``apply_bulk``, leased and fenced, with a
count and the skip reasons per run."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_weft import client
from django_weft.engine.errors import BulkJobNotFound, InvalidInput
from django_weft.models import BulkJob, WorkflowRun
from django_weft.runtime import (
    get_bulk_job,
    get_store,
    lifecycle,
    process_bulk_jobs,
    register_run_source,
    start_bulk_job,
    tick,
)
from django_weft.runtime.bulk_jobs import LEASE, RUN_IDS_LISTED, BulkJobRecord
from django_weft.runtime.dispatch import SweepOnlyDispatcher
from django_weft.testing import drive
from tests.support.driver import park
from tests.support.threads import in_threads

pytestmark = pytest.mark.django_db(transaction=True)

WAITS = "tests.m.wait_with_timeout"


def waiting(workflow_id: str, **attributes: Any) -> str:
    handle = client.start(WAITS, args=[3600], id=workflow_id, search_attributes=attributes)
    park(handle.run_id)
    return handle.run_id


def started(workflow_id: str, **attributes: Any) -> str:
    """A run started and not driven: running, unowned."""
    return client.start(
        "tests.sleepy", kwargs={"seconds": 3600}, id=workflow_id, search_attributes=attributes
    ).run_id


def status(run_id: str) -> str:
    return WorkflowRun.objects.get(pk=run_id).status


def until_finished(batch: int = 100) -> int:
    """Call ``process_bulk_jobs`` until no job is open; the number of calls."""
    calls = 0
    while BulkJob.objects.filter(status__in=["pending", "running"]).exists():
        process_bulk_jobs(batch)
        calls += 1
        assert calls < 1000
    return calls


def test_a_job_is_stored_pending_and_changes_nothing_until_the_tick_works_on_it() -> None:
    ids = [started(f"job-{i}", lot="a") for i in range(5)]
    other = started("not-in-the-lot", lot="b")

    job = start_bulk_job("cancel", {"search_attributes__lot": "a"}, reason="lot a recalled", user="ann")

    assert isinstance(job, BulkJobRecord)
    assert (job.status, job.action, job.matched, job.reason, job.created_by) == (
        "pending",
        "cancel",
        5,
        "lot a recalled",
        "ann",
    )
    assert (job.done, job.skipped, job.failed, job.reached, job.finished) == (0, 0, 0, 0, False)
    assert all(status(run_id) == "running" for run_id in ids)

    assert process_bulk_jobs(2) == 2
    assert get_bulk_job(job.id).status == "running"
    assert process_bulk_jobs(2) == 2
    assert process_bulk_jobs(2) == 1  # short: the job is done

    final = get_bulk_job(job.id)
    assert (final.status, final.done, final.skipped, final.failed) == ("completed", 5, 0, 0)
    assert final.finished_at is not None and final.finished
    assert all(status(run_id) == "cancelled" for run_id in ids)
    assert WorkflowRun.objects.get(pk=ids[0]).error["reason"] == "lot a recalled"
    assert status(other) == "running"
    assert process_bulk_jobs(2) == 0  # nothing open


def test_a_batch_exactly_as_long_as_the_rest_is_followed_by_an_empty_one_that_completes() -> None:
    for i in range(4):
        started(f"even-{i}")
    job = start_bulk_job("suspend", {"workflow_name": "tests.sleepy"})
    assert process_bulk_jobs(2) == 2
    assert process_bulk_jobs(2) == 2
    assert get_bulk_job(job.id).status == "running"
    assert process_bulk_jobs(2) == 0
    assert get_bulk_job(job.id).status == "completed"
    assert get_bulk_job(job.id).done == 4


def test_runs_created_after_the_job_started_are_left_alone() -> None:
    before = started("before")
    job = start_bulk_job("cancel", {"workflow_name": "tests.sleepy"})
    after = started("after")

    until_finished()

    assert status(before) == "cancelled" and status(after) == "running"
    assert get_bulk_job(job.id).done == 1


def test_runs_that_changed_state_since_the_job_started_are_skipped_with_the_reason() -> None:
    ids = [waiting(f"changing-{i}") for i in range(6)]
    job = start_bulk_job("suspend", {"workflow_name": WAITS}, user="ops")
    # Meanwhile someone else cancels one run and suspends another.
    client.get_handle(ids[1]).cancel()
    client.get_handle(ids[3]).suspend()

    until_finished(batch=4)

    final = get_bulk_job(job.id)
    assert (final.done, final.skipped, final.failed, final.matched) == (4, 2, 0, 6)
    reasons = {entry["reason"]: entry for entry in final.skipped_reasons}
    assert reasons == {
        "already finished (cancelled)": {
            "reason": "already finished (cancelled)",
            "count": 1,
            "run_ids": [ids[1]],
        },
        "not running or waiting (suspended)": {
            "reason": "not running or waiting (suspended)",
            "count": 1,
            "run_ids": [ids[3]],
        },
    }
    assert status(ids[0]) == "suspended" and status(ids[1]) == "cancelled"


def test_a_run_that_changes_between_its_batch_read_and_its_lock_is_skipped_with_what_the_lock_saw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = sorted((waiting("race-1"), waiting("race-2")), key=uuid.UUID)  # batch order
    job = start_bulk_job("terminate", {"workflow_name": WAITS})
    real_cancel = lifecycle.cancel

    def another_process_cancels_the_second_first(ref: Any, reason: str | None = None) -> str:
        if str(ref) == first:
            real_cancel(second, "by someone else")  # after the batch was read
        return real_cancel(ref, reason)

    monkeypatch.setattr(lifecycle, "cancel", another_process_cancels_the_second_first)
    until_finished()

    final = get_bulk_job(job.id)
    assert (final.done, final.skipped) == (1, 1)
    assert final.skipped_reasons == [
        {"reason": "already finished (cancelled)", "count": 1, "run_ids": [second]}
    ]
    assert WorkflowRun.objects.get(pk=second).error["reason"] == "by someone else"


def test_terminate_is_the_immediate_cancel() -> None:
    run_id = waiting("to-terminate")
    job = start_bulk_job("terminate", {"workflow_id": "to-terminate"}, reason="stuck")
    until_finished()
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == "cancelled" and run.error["reason"] == "stuck"
    assert get_bulk_job(job.id).done == 1


def test_resume_and_retry_jobs_make_their_runs_runnable() -> None:
    failed = client.start("tests.raises", id="job-failed")
    drive(failed.run_id)
    suspended = waiting("job-suspended")
    client.get_handle(suspended).suspend()

    retry = start_bulk_job("retry", {"status": "failed"})
    resume = start_bulk_job("resume", {"status": "suspended"})
    until_finished()

    assert get_bulk_job(retry.id).done == 1 and get_bulk_job(resume.id).done == 1
    assert status(failed.run_id) == "running" and status(suspended) == "running"


def test_skipped_run_ids_and_failures_are_capped_and_the_counts_complete() -> None:
    count = RUN_IDS_LISTED + 5
    for i in range(count):
        client.start("tests.echo", id=f"done-{i}")
    WorkflowRun.objects.update(status="completed")
    job = start_bulk_job("cancel", {"workflow_name": "tests.echo"})

    until_finished(batch=40)

    final = get_bulk_job(job.id)
    assert (final.done, final.skipped) == (0, count)
    (entry,) = final.skipped_reasons
    assert entry["reason"] == "already finished (completed)" and entry["count"] == count
    assert len(entry["run_ids"]) == RUN_IDS_LISTED
    assert len(set(entry["run_ids"])) == RUN_IDS_LISTED


def test_a_leased_job_waits_for_its_lease_and_a_stale_batch_is_not_recorded() -> None:
    ids = [started(f"leased-{i}") for i in range(3)]
    job = start_bulk_job("cancel", {"workflow_name": "tests.sleepy"})
    store = get_store()
    held = store.bulk_jobs.claim_bulk_job(LEASE)  # a process that then died
    assert held is not None and held.epoch == 1

    assert process_bulk_jobs() == 0  # the lease holds it
    assert all(status(run_id) == "running" for run_id in ids)

    BulkJob.objects.filter(pk=job.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert process_bulk_jobs() == 3  # taken over at epoch 2
    assert get_bulk_job(job.id).status == "completed"
    # The dead process's late write is refused: another claim holds the job now.
    assert not store.bulk_jobs.record_bulk_batch(
        held.pk, held.epoch, done=99, skipped=[], failures=[], cursor=None, finished=False, listed=10
    )
    assert not store.bulk_jobs.fail_bulk_job(held.pk, held.epoch, "late")
    assert get_bulk_job(job.id).done == 3


def test_a_redone_batch_skips_the_runs_the_dead_process_changed() -> None:
    ids = [started(f"redo-{i}") for i in range(3)]
    job = start_bulk_job("cancel", {"workflow_name": "tests.sleepy"})
    store = get_store()
    held = store.bulk_jobs.claim_bulk_job(LEASE)
    assert held is not None
    client.get_handle(ids[0]).cancel()  # the dead process got this far
    BulkJob.objects.filter(pk=job.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    until_finished()

    final = get_bulk_job(job.id)
    assert (final.done, final.skipped) == (2, 1)
    assert final.skipped_reasons[0]["reason"] == "already finished (cancelled)"
    assert all(status(run_id) == "cancelled" for run_id in ids)


def explodes(job: BulkJob) -> Any:
    raise RuntimeError("the tenant service is down")


register_run_source("tests.explodes", explodes)


def test_a_job_whose_runs_cannot_be_read_fails_with_the_error_and_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run_id = started("unreadable")
    job = start_bulk_job("cancel", {"workflow_name": "tests.sleepy"})
    BulkJob.objects.filter(pk=job.id).update(runs_from="tests.explodes")

    assert process_bulk_jobs() == 0

    final = get_bulk_job(job.id)
    assert final.status == "failed" and final.finished_at is not None
    assert final.error == "RuntimeError: the tenant service is down"
    assert status(run_id) == "running"
    assert process_bulk_jobs() == 0


def test_a_job_whose_stored_action_is_unknown_fails_instead_of_stopping_every_tick() -> None:
    run_id = started("odd-action")
    job = start_bulk_job("cancel", {"workflow_name": "tests.sleepy"})
    BulkJob.objects.filter(pk=job.id).update(action="explode")  # written by hand, say

    assert process_bulk_jobs() == 0
    final = get_bulk_job(job.id)
    assert final.status == "failed" and "unknown bulk operation 'explode'" in final.error
    assert status(run_id) == "running"


def test_the_tick_works_on_open_jobs() -> None:
    ids = [started(f"ticked-{i}") for i in range(3)]
    job = start_bulk_job("cancel", {"workflow_name": "tests.sleepy"})
    report = tick(SweepOnlyDispatcher())
    assert report.bulk == 3
    assert get_bulk_job(job.id).status == "completed"
    assert all(status(run_id) == "cancelled" for run_id in ids)


def test_two_processes_share_the_jobs_and_each_run_is_counted_once() -> None:
    for lot in ("x", "y"):
        for i in range(30):
            started(f"{lot}-{i}", lot=lot)
    jobs = [start_bulk_job("cancel", {"search_attributes__lot": lot}) for lot in ("x", "y")]

    def work(_: int) -> None:
        while BulkJob.objects.filter(status__in=["pending", "running"]).exists():
            process_bulk_jobs(7)

    in_threads(work, 2, timeout=120)

    for job in jobs:
        final = get_bulk_job(job.id)
        assert final.status == "completed"
        assert final.done + final.skipped == 30 and final.failed == 0
    assert WorkflowRun.objects.filter(status="cancelled").count() == 60
    assert sum(get_bulk_job(job.id).done for job in jobs) == 60


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"action": "explode"}, "action", "unknown bulk operation 'explode'"),
        ({"action": "suspend", "reason": "why"}, "reason", "suspend takes no reason"),
        ({"reason": 7}, "reason", "reason must be a string"),
        ({"filter": ["status"]}, "filter", "filter must be a dict with string keys"),
        ({"filter": {"status__bogus": 1}}, "filter", "the filter cannot be applied"),
        ({"filter": {"workflow_id": "a\x00b"}}, "filter", "NUL character"),
        ({"reason": "a\ud800"}, "reason", "lone surrogate"),
        ({"user": "u" * 256}, "user", "at most 255 characters"),
        ({"runs_from": "tests.nowhere.runs"}, None, "no run source named 'tests.nowhere.runs'"),
        ({"runs_from": "django_weft.runtime.bulk_jobs.RUN_IDS_LISTED"}, None, "no run source named"),
        (
            {"runs_from": "tests.not_a_queryset"},
            None,
            "must return a WorkflowRun queryset",
        ),
    ],
)
def test_bad_input_is_refused_and_nothing_is_stored(
    kwargs: dict[str, Any], field: str | None, message: str
) -> None:
    started("bad-input")
    arguments: dict[str, Any] = {"action": "cancel", "filter": {"workflow_name": "tests.sleepy"}, **kwargs}
    with pytest.raises(InvalidInput, match=message) as caught:
        start_bulk_job(arguments.pop("action"), arguments.pop("filter"), **arguments)
    assert getattr(caught.value, "field", None) == field
    assert not BulkJob.objects.exists()


def not_a_queryset(job: BulkJob) -> Any:
    return [1, 2]


register_run_source("tests.not_a_queryset", not_a_queryset)


def test_an_unknown_job_is_not_found() -> None:
    with pytest.raises(BulkJobNotFound):
        get_bulk_job(uuid.uuid4())
    with pytest.raises(BulkJobNotFound):
        get_bulk_job("not-a-uuid")
