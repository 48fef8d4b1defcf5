"""``WeftTaskBackend`` against the task framework's documented behaviour: the capability
flags, ``enqueue`` and ``get_result``, ``refresh()``, ``return_value``, errors, retries,
``TaskContext``, priorities, ``run_after``, queues, ``using()``, the signals, the
backend's checks, and enqueueing inside a transaction. Runs are driven in the test's
thread on the ``weft`` fixture's virtual clock. On both databases, and on both Django
lines (``django.tasks`` on Django 6, the ``django-tasks`` backport on 5.2).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction

from django_weft import client, runtime
from django_weft.models import WorkflowRun
from django_weft.tasks import WeftTaskBackend, WorkerLost, framework, results
from django_weft.tasks.framework import TaskResultStatus
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


def backend(alias: str = "default") -> Any:
    return framework.task_backends[alias]


def run_of(result: Any) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=result.id)


# -- the backend ---------------------------------------------------------------------------------


def test_every_capability_flag_is_true() -> None:
    weft = backend()
    assert isinstance(weft, WeftTaskBackend)
    assert weft.supports_defer and weft.supports_async_task
    assert weft.supports_get_result and weft.supports_priority


def test_a_task_made_by_the_backend_carries_its_retry_policy() -> None:
    assert tasks.fails_until.retry is not None and tasks.fails_until.retry.max_attempts == 3
    assert tasks.add.retry is None
    if tasks.TASK_TAKES_OPTIONS:  # Django 6.0's @task takes no retry= to refuse
        with pytest.raises(framework.InvalidTask, match="RetryPolicy"):
            framework.task(retry={"max_attempts": 2})(tasks.add.func)


# -- enqueue and get_result ----------------------------------------------------------------------


def test_enqueue_returns_a_ready_result_whose_id_finds_the_run(weft: Any) -> None:
    result = tasks.add.enqueue(2, 3)
    assert result.status == READY
    assert (result.args, result.kwargs, result.backend) == ([2, 3], {}, "default")
    assert result.enqueued_at is not None and result.started_at is None and result.finished_at is None
    assert (result.attempts, result.worker_ids, result.errors) == (0, [], [])
    assert not result.is_finished
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value
    run = run_of(result)
    assert run.workflow_name == "tests.testapp.tasks.add" == tasks.add.module_path
    assert run.search_attributes == {"weft_task": "default", "weft_queue": "default"}
    again = tasks.add.get_result(result.id)
    assert (again.id, again.status, again.enqueued_at) == (result.id, READY, run.created_at)


def test_a_finished_task_reports_its_times_worker_and_return_value(weft: Any) -> None:
    result = tasks.add.enqueue(2, 3)
    weft.run_until_idle()
    result.refresh()
    assert result.status == SUCCESSFUL and result.is_finished
    assert result.return_value == 5
    assert result.attempts == 1 and result.worker_ids == [weft.engine.engine_id]
    assert result.errors == []
    # (The virtual clock gives the step's times; the run's creation is the wall clock's.)
    assert result.enqueued_at is not None
    assert result.started_at == result.last_attempted_at <= result.finished_at
    assert run_of(result).status == "completed"


def test_get_result_of_an_id_that_is_no_task_raises_the_frameworks_error(weft: Any) -> None:
    with pytest.raises(framework.TaskResultDoesNotExist):
        backend().get_result("00000000-0000-0000-0000-000000000000")
    with pytest.raises(framework.TaskResultDoesNotExist):
        backend().get_result("not a run id")
    workflow_run = client.start("tests.echo", args=["x"])
    with pytest.raises(framework.TaskResultDoesNotExist, match="not a task"):
        backend().get_result(workflow_run.run_id)
    other = tasks.retried_by_backend.enqueue("k")  # a task of the "retrying" backend
    with pytest.raises(framework.TaskResultDoesNotExist):
        backend().get_result(other.id)
    assert backend("retrying").get_result(other.id).id == other.id


def test_get_result_of_another_tasks_id_is_a_mismatch(weft: Any) -> None:
    result = tasks.add.enqueue(1, 1)
    with pytest.raises(framework.TaskResultMismatch):
        tasks.noop.get_result(result.id)


def test_an_async_task_runs_to_its_value(weft: Any) -> None:
    result = tasks.async_add.enqueue(4, 5)
    weft.run_until_idle()
    result.refresh()
    assert (result.status, result.return_value) == (SUCCESSFUL, 9)


def test_arguments_the_function_cannot_take_are_refused_at_enqueue(weft: Any) -> None:
    before = WorkflowRun.objects.count()
    with pytest.raises(TypeError):
        tasks.add.enqueue(1, 2, 3)
    with pytest.raises(Exception, match="JSON"):
        tasks.add.enqueue(object(), 1)
    assert WorkflowRun.objects.count() == before


def test_keyword_arguments_named_as_the_engine_names_its_own_reach_the_task(weft: Any) -> None:
    more = {"target": "t", "args": "a", "kwargs": "k", "act": "x", "seq": 1, "attempt": 2}
    result = tasks.named_like_the_engine.enqueue(ctx="c", **more)
    weft.run_until_idle()
    result.refresh()
    assert (result.status, result.return_value) == (SUCCESSFUL, ["c", more])


# -- failures and retries ------------------------------------------------------------------------


def test_a_failing_task_without_a_policy_runs_once_and_reports_its_error(weft: Any) -> None:
    result = tasks.always_fails.enqueue("no luck")
    weft.run_until_idle()
    result.refresh()
    assert result.status == FAILED and result.is_finished
    assert result.attempts == 1
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "no luck" in error.traceback and "Traceback" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value
    assert result.finished_at is not None


def test_a_policy_on_the_task_retries_it_and_each_attempt_is_counted(weft: Any) -> None:
    result = tasks.fails_until.enqueue("three", 3)
    weft.run_until_idle()
    result.refresh()
    assert (result.status, result.return_value) == (SUCCESSFUL, 3)
    assert result.attempts == 3 and result.worker_ids == [weft.engine.engine_id] * 3
    assert [e.exception_class for e in result.errors] == [RuntimeError, RuntimeError]
    assert "attempt 1 of three fails" in result.errors[0].traceback
    assert result.started_at < result.last_attempted_at


def test_a_policy_gives_up_after_its_attempts(weft: Any) -> None:
    result = tasks.fails_until.enqueue("never", 10)
    weft.run_until_idle()
    result.refresh()
    assert result.status == FAILED
    assert result.attempts == 3 and len(result.errors) == 3


def test_the_backends_options_give_the_default_policy(weft: Any) -> None:
    result = tasks.retried_by_backend.enqueue("backend")
    weft.run_until_idle()
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (SUCCESSFUL, 3, 3)
    assert [e.exception_class for e in result.errors] == [ConnectionError, ConnectionError]


# -- the task's context --------------------------------------------------------------------------


def test_a_task_that_takes_its_context_sees_its_result_and_attempt(weft: Any) -> None:
    result = tasks.with_context.enqueue("ctx")
    weft.run_until_idle()
    result.refresh()
    assert result.return_value == {"attempt": 1, "id": result.id, "status": "RUNNING"}


def test_the_context_of_a_retried_attempt_counts_the_attempts_before_it(weft: Any) -> None:
    result = tasks.context_on_retry.enqueue("ctx-retry")
    weft.run_until_idle()
    result.refresh()
    assert result.return_value == {"attempt": 2, "workers": 2}


# -- priority, run_after, queues, using() --------------------------------------------------------


def test_the_tasks_priority_is_the_runs(weft: Any) -> None:
    assert run_of(tasks.noop.enqueue()).priority == 5
    assert run_of(tasks.noop.using(priority=-7).enqueue()).priority == -7
    with pytest.raises(framework.InvalidTask, match="priority"):
        tasks.noop.using(priority=101)
    # Whole numbers the framework takes, whatever their type.
    assert run_of(tasks.noop.using(priority=3.0).enqueue()).priority == 3  # type: ignore[arg-type]
    assert run_of(tasks.noop.using(priority=True).enqueue()).priority == 1


def test_a_run_after_beyond_what_a_run_can_wait_is_an_invalid_task(weft: Any) -> None:
    before = WorkflowRun.objects.count()
    with pytest.raises(framework.InvalidTask, match="more than 100 years ahead"):
        tasks.add.using(run_after=weft.now() + timedelta(days=365 * 101)).enqueue(1, 2)
    assert WorkflowRun.objects.count() == before


def test_run_after_is_a_durable_timer(weft: Any) -> None:
    later = weft.now() + timedelta(hours=1)
    result = tasks.add.using(run_after=later).enqueue(1, 2)
    assert result.enqueued_at == run_of(result).created_at
    weft.run_until_idle()
    result.refresh()
    assert result.status == READY and run_of(result).status == "pending"
    weft.advance(timedelta(minutes=59))
    weft.run_until_idle()
    assert tasks.add.get_result(result.id).status == READY
    weft.advance(timedelta(minutes=1, seconds=1))
    weft.run_until_idle()
    result.refresh()
    assert (result.status, result.return_value) == (SUCCESSFUL, 3)
    assert result.started_at >= later
    # The result's task is the task as it was enqueued, its run_after too, read back as given.
    assert result.task.run_after == later and tasks.add.get_result(result.id).task.run_after == later
    assert tasks.add.get_result(result.id).enqueued_at == run_of(result).created_at
    assert tasks.add.enqueue(1, 2).task.run_after is None


def test_a_task_on_another_queue_runs_as_a_queued_step_on_it(weft: Any) -> None:
    result = tasks.send_email.enqueue("ada@example.com")
    assert run_of(result).search_attributes["weft_queue"] == "emails"
    weft.run_until_idle()
    result.refresh()
    assert (result.status, result.return_value) == (SUCCESSFUL, "sent to ada@example.com")
    assert result.worker_ids == [runtime.get_engine().engine_id]  # the process's, which ran it
    assert result.task.queue_name == "emails"


def test_a_queue_the_backend_does_not_list_is_refused() -> None:
    with pytest.raises(framework.InvalidTask, match="Queue 'nowhere'"):
        tasks.add.using(queue_name="nowhere")


def test_using_another_backend_runs_the_task_there() -> None:
    result = tasks.add.using(backend="immediate").enqueue(20, 22)
    assert (result.status, result.return_value) == (SUCCESSFUL, 42)


# -- transactions --------------------------------------------------------------------------------


def test_an_enqueue_in_a_rolled_back_transaction_leaves_nothing(weft: Any) -> None:
    before = WorkflowRun.objects.count()

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        result = tasks.add.enqueue(1, 1)
        assert WorkflowRun.objects.filter(pk=result.id).exists()
        raise Rollback
    assert WorkflowRun.objects.count() == before
    with pytest.raises(framework.TaskResultDoesNotExist):
        tasks.add.get_result(result.id)


def test_an_enqueue_in_a_committed_transaction_runs(weft: Any) -> None:
    with transaction.atomic():
        result = tasks.add.enqueue(1, 1)
    weft.run_until_idle()
    result.refresh()
    assert result.status == SUCCESSFUL


# -- signals -------------------------------------------------------------------------------------


@pytest.fixture
def received() -> Iterator[list[tuple[str, str, str]]]:
    """The framework's signals received, as (name, id, status). Its tests commit (the
    signals that wait for a commit are sent then)."""
    seen: list[tuple[str, str, str]] = []

    def receiver(name: str) -> Any:
        def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((name, task_result.id, str(task_result.status)))

        return receive

    receivers = {
        framework.task_enqueued: receiver("enqueued"),
        framework.task_started: receiver("started"),
        framework.task_finished: receiver("finished"),
    }
    for signal, receive in receivers.items():
        signal.connect(receive)
    yield seen
    for signal, receive in receivers.items():
        signal.disconnect(receive)


@pytest.mark.django_db(transaction=True)
def test_the_frameworks_signals_are_sent(weft: Any, received: list[tuple[str, str, str]]) -> None:
    ok = tasks.add.enqueue(1, 2)
    bad = tasks.always_fails.enqueue("x")
    weft.run_until_idle()
    assert [item for item in received if item[1] == ok.id] == [
        ("enqueued", ok.id, "READY"),
        ("started", ok.id, "RUNNING"),
        ("finished", ok.id, "SUCCESSFUL"),
    ]
    assert [item for item in received if item[1] == bad.id] == [
        ("enqueued", bad.id, "READY"),
        ("started", bad.id, "RUNNING"),
        ("finished", bad.id, "FAILED"),
    ]


def _fields(result: Any) -> tuple[Any, ...]:
    value = result.return_value if result.status == SUCCESSFUL else None
    task = result.task
    return (
        result.id, result.status, result.enqueued_at, result.started_at, result.finished_at,
        result.last_attempted_at, result.args, result.kwargs, result.backend, result.errors,
        result.worker_ids, task.module_path, task.priority, task.queue_name, task.backend, value,
    )  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_the_started_and_finished_signals_carry_what_get_result_returns_then(
    weft: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first attempt run inline is reported without reading the run back (what its
    turn holds is enough); a retried one, a queued one and a failed one are read. Either
    way the result sent is the one ``get_result`` returns at that moment."""
    sent: list[tuple[str, tuple[Any, ...], tuple[Any, ...]]] = []

    def receiver(name: str) -> Any:
        def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
            now = task_result.task.get_backend().get_result(task_result.id)
            sent.append((name, _fields(task_result), _fields(now)))

        return receive

    reads: list[str] = []
    read = results.read

    def counted(result_id: Any, **kwargs: Any) -> Any:
        if "alias" not in kwargs:  # django_weft's own read, not the receivers' get_result
            reads.append(str(result_id))
        return read(result_id, **kwargs)

    started, finished = receiver("started"), receiver("finished")
    framework.task_started.connect(started)
    framework.task_finished.connect(finished)
    try:
        inline = [
            tasks.add.enqueue(1, 2),
            tasks.noop.using(priority=-7).enqueue(),
            tasks.with_context.enqueue("signals"),
            tasks.async_add.enqueue(2, 3),
        ]
        retried = tasks.fails_until.enqueue("signals-retried", 2)
        queued = tasks.send_email.enqueue("a@example.com")
        failed = tasks.always_fails.enqueue("no")
        monkeypatch.setattr(results, "read", counted)
        weft.run_until_idle()
    finally:
        framework.task_started.disconnect(started)
        framework.task_finished.disconnect(finished)
    for name, reported, read_then in sent:
        assert reported == read_then, name
    signals_of = {result.id: [name for name, reported, _ in sent if reported[0] == result.id]
                  for result in [*inline, retried, queued, failed]}  # fmt: skip
    assert signals_of[retried.id] == ["started", "started", "finished"]  # one per attempt
    for result in [*inline, queued, failed]:
        assert signals_of[result.id] == ["started", "finished"]
    assert not {result.id for result in inline} & set(reads)
    assert reads.count(retried.id) == 1  # its second attempt's start
    assert reads.count(queued.id) == 2  # run by a queued attempt, ended by a later turn
    assert reads.count(failed.id) == 1  # its end


@pytest.mark.django_db(transaction=True)
def test_task_enqueued_waits_for_the_commit(weft: Any, received: list[tuple[str, str, str]]) -> None:
    with transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        assert received == []
    assert received == [("enqueued", result.id, "READY")]


# -- cancel and retry, as for any run ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_task_is_failed_and_says_why(weft: Any, received: list[tuple[str, str, str]]) -> None:
    result = tasks.add.using(run_after=weft.now() + timedelta(hours=1)).enqueue(1, 2)
    client.get_handle(result.id).cancel("not needed")
    result.refresh()
    assert result.status == FAILED
    [error] = result.errors
    assert error.exception_class_path == "django_weft.engine.errors.WorkflowCancelled"
    assert ("finished", result.id, "FAILED") in received


def test_a_failed_task_retried_from_the_client_runs_again(weft: Any) -> None:
    result = tasks.fails_until.using(backend="default").enqueue("later", 4)  # 3 attempts: fails
    weft.run_until_idle()
    result.refresh()
    assert result.status == FAILED
    client.get_handle(result.id).retry()
    weft.run_until_idle()
    result.refresh()
    assert (result.status, result.return_value) == (SUCCESSFUL, 4)
    assert SideEffect.objects.filter(key="later").count() == 4


# -- the error class of a lost attempt -----------------------------------------------------------


def test_the_lost_attempt_error_class_can_be_imported() -> None:
    from django.utils.module_loading import import_string

    assert import_string("django_weft.tasks.runner.WorkerLost") is WorkerLost


# -- tasks as workflow steps ---------------------------------------------------------------------


def test_tasks_are_recorded_steps_of_a_workflow_on_their_queues(weft: Any) -> None:
    handle = client.start("tests.tasks.welcome", args=["bob"])
    weft.run_until_idle()
    assert handle.result() == {"total": 5, "sent": "sent to bob", "attempt": 2}
    steps = handle.read_history()
    assert [(s.kind, s.name, s.status) for s in steps] == [
        ("activity", "tests.testapp.tasks.add", "completed"),
        ("activity", "tests.testapp.tasks.send_email", "completed"),
        ("activity", "tests.testapp.tasks.fails_until", "completed"),
    ]
    assert [s.attempt for s in steps] == [1, 1, 2]
    assert steps[0].result == 5  # a step's value, as the workflow gets it
    # Replayed, not run again: one email, two attempts of the flaky task.
    assert SideEffect.objects.filter(key="email:bob").count() == 1
    assert SideEffect.objects.filter(key="welcome:bob").count() == 2
    assert not WorkflowRun.objects.filter(search_attributes__has_key="weft_task").exists()


def test_a_task_of_another_backend_is_a_step_too(weft: Any) -> None:
    handle = client.start("tests.tasks.immediate_step", args=[21])
    weft.run_until_idle()
    assert handle.result() == 42


# -- attempts lost with their worker -------------------------------------------------------------


def crash_and_take_over(weft: Any, times: int) -> None:
    """Drive the runs; each WorkerCrash leaves a run owned by a "dead" worker, whose lease
    the clock then runs out (``advance`` drives what is due: the takeover)."""
    with pytest.raises(tasks.WorkerCrash):
        weft.run_until_idle()
    for _ in range(times - 1):
        with pytest.raises(tasks.WorkerCrash):
            weft.advance(timedelta(minutes=5))
    weft.advance(timedelta(minutes=5))


def test_an_attempt_lost_with_its_worker_is_counted_and_run_again(weft: Any) -> None:
    result = tasks.crashes.enqueue("lost-once", 1)
    crash_and_take_over(weft, 1)
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (SUCCESSFUL, 2, 2)
    [lost] = result.errors
    assert lost.exception_class is WorkerLost and "did not end" in lost.traceback
    assert result.started_at < result.last_attempted_at


def test_a_lost_attempt_does_not_use_up_the_retry_policy(weft: Any) -> None:
    # Two attempts allowed: one lost, one failed, and the third (the policy's second) succeeds.
    result = tasks.crashes.enqueue("lost-then-fails", 1, then_fails=1)
    crash_and_take_over(weft, 1)
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (SUCCESSFUL, 3, 3)
    assert [e.exception_class for e in result.errors] == [WorkerLost, RuntimeError]


def test_a_task_lost_three_times_fails(weft: Any) -> None:
    result = tasks.crashes.enqueue("always-lost", 10)
    crash_and_take_over(weft, 3)
    result.refresh()
    assert result.status == FAILED
    assert result.attempts == 3 and [e.exception_class for e in result.errors] == [WorkerLost] * 3


def test_a_queued_attempt_lost_with_its_worker_is_counted_and_sent_again(weft: Any) -> None:
    # No retry policy: a lost attempt is not a failure, so the task still gets its run.
    result = tasks.crashes_on_queue.enqueue("queued")
    crash_and_take_over(weft, 1)
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (SUCCESSFUL, 2, 2)
    [lost] = result.errors
    assert lost.exception_class is WorkerLost
    assert result.worker_ids == [runtime.get_engine().engine_id] * 2
