"""Tasks of Django's task framework under real ``weft_worker`` processes: a worker
SIGKILLed in the middle of a task (another finishes it, and both attempts are counted),
and a task enqueued in a committed transaction picked up at once, without waiting for
a sweep (PostgreSQL's work notices)."""

from __future__ import annotations

import statistics
import time

import pytest
from django.conf import settings  # noqa: F401  (read by the skipif conditions)
from django.db import connection, transaction

from django_weft.tasks import WorkerLost
from django_weft.tasks.framework import TaskResultStatus
from tests.testapp import tasks
from tests.testapp.models import SideEffect

from .conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def marked(key: str) -> int:
    return SideEffect.objects.filter(key=key).count()


def test_a_task_whose_worker_is_killed_completes_on_another_and_counts_both_attempts(start_worker) -> None:  # type: ignore[no-untyped-def]
    result = tasks.marks.enqueue("killed", seconds=4.0)
    first = start_worker(threads=1)
    wait_for(lambda: marked("begin:killed") == 1, 30, "the first worker to start the task")
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING and result.attempts == 1
    first.kill()
    second = start_worker(threads=1)
    wait_for(lambda: tasks.marks.get_result(result.id).is_finished, 60, "the second worker to finish it")
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, "killed")
    assert result.attempts == 2
    assert result.worker_ids[0] != result.worker_ids[1]
    assert f":{first.pid}:" in result.worker_ids[0] and f":{second.pid}:" in result.worker_ids[1]
    [lost] = result.errors
    assert lost.exception_class is WorkerLost
    assert (marked("begin:killed"), marked("end:killed")) == (2, 1)
    assert result.started_at < result.last_attempted_at < result.finished_at


@pytest.mark.skipif(
    "connection.vendor != 'postgresql' or not settings.WEFT_NOTIFY",
    reason="work notices are PostgreSQL's, and on (WEFT_TEST_NOTIFY)",
)
def test_a_task_enqueued_in_a_committed_transaction_starts_without_waiting_for_a_sweep(start_worker) -> None:  # type: ignore[no-untyped-def]
    # The worker sweeps every 30 s: only the commit's notice can wake it sooner.
    worker = start_worker(threads=2, tick=30.0)
    wait_for(lambda: "started:" in worker.log, 60, "the worker to start")
    time.sleep(0.5)  # its first sweep (at start) is behind it
    waits = []
    for n in range(20):
        with transaction.atomic():
            result = tasks.add.enqueue(n, 1)
        done = lambda result=result: tasks.add.get_result(result.id).is_finished  # noqa: E731
        wait_for(done, 10, "the task to run", interval=0.02)
        result.refresh()
        waits.append((result.started_at - result.enqueued_at).total_seconds())
    p50, most = statistics.median(waits) * 1000, max(waits) * 1000
    print(f"enqueued -> started: p50 {p50:.1f} ms, max {most:.1f} ms")
    assert max(waits) < 10  # never the 30 s sweep


@pytest.mark.skipif(
    "connection.vendor != 'postgresql' or not settings.WEFT_NOTIFY",
    reason="work notices are PostgreSQL's, and on (WEFT_TEST_NOTIFY)",
)
def test_a_rolled_back_enqueue_sends_no_notice_and_leaves_no_run(start_worker) -> None:  # type: ignore[no-untyped-def]
    worker = start_worker(threads=1, tick=30.0)
    wait_for(lambda: "started:" in worker.log, 60, "the worker to start")

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        rolled_back = tasks.marks.enqueue("rolled-back")
        raise Rollback
    kept = tasks.marks.enqueue("kept")
    wait_for(lambda: tasks.marks.get_result(kept.id).is_finished, 10, "the committed task to run")
    assert marked("begin:rolled-back") == 0
    assert f"run {rolled_back.id}" not in worker.log
    assert connection.vendor == "postgresql"


@pytest.mark.postgres
def test_tasks_run_on_celery_workers_each_queue_on_its_own(celery_cluster) -> None:  # type: ignore[no-untyped-def]
    """With django_weft.contrib.celery, a task's turn goes to Celery, and a task on the
    "emails" queue runs on the worker that consumes that Celery queue only."""
    turns = celery_cluster.worker(concurrency=2, queues="celery,tests")
    emails = celery_cluster.worker(concurrency=1, queues="emails")
    for process in (turns, emails):
        process.wait_ready()
    added = tasks.add.enqueue(2, 2)
    sent = tasks.send_email.enqueue("grace@example.com")
    for result in (added, sent):
        done = lambda result=result: result.task.get_result(result.id).is_finished  # noqa: E731
        wait_for(done, 30, "the tasks to finish")
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL, (result.errors, celery_cluster.logs())
    assert (added.return_value, sent.return_value) == (4, "sent to grace@example.com")
    assert len(sent.worker_ids) == 1 and sent.worker_ids != added.worker_ids
    # The email's attempt ran on the worker of the "emails" queue; the turns on the other.
    ran = {
        process: {kind for kind in ("run_turn", "run_activity") if f"Task django_weft.{kind}[" in process.log}
        for process in (turns, emails)
    }
    assert ran == {turns: {"run_turn"}, emails: {"run_activity"}}
