"""End-to-end behaviour of runs driven in the test process (PostgreSQL and SQLite)."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.test import override_settings

from django_weft import (
    InvalidDuration,
    InvalidInput,
    NonDeterminismError,
    PayloadError,
    ResultTimeout,
    WeftError,
    WorkflowAlreadyExists,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowNotRegistered,
    client,
)
from django_weft.models import Step, Timer, WorkflowRun
from django_weft.testing import drive, make_engine
from tests.support.threads import in_threads
from tests.testapp import workflows as wf
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def side_effects(prefix: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key in SideEffect.objects.filter(key__startswith=prefix).values_list("key", flat=True):
        counts[key] = counts.get(key, 0) + 1
    return counts


# -- completion ---------------------------------------------------------------------------


def test_ten_steps_recorded_once_each_and_result_returned() -> None:
    handle = client.start("tests.ten_steps", args=["t10"])
    assert drive(handle.run_id) == "completed"
    assert handle.result(timeout=1) == {"total": 45}
    assert list(Step.objects.filter(run_id=handle.run_id).values_list("seq", flat=True)) == list(range(10))
    assert side_effects("t10:") == {f"t10:{i}": 1 for i in range(10)}
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.owner_id is None and run.owner_epoch == 1 and run.finished_at is not None


def test_shorthand_start_and_handle_lookup_by_workflow_id() -> None:
    handle = wf.echo.start(1, 2, flag=True)
    drive(handle.run_id)
    assert handle.result() == {"args": [1, 2], "kwargs": {"flag": True}}
    again = client.get_handle(handle.workflow_id)
    assert again.run_id == handle.run_id
    assert client.get_handle(handle.run_id) == handle
    described = handle.describe()
    assert described["status"] == "completed" and described["workflow"] == "tests.echo"


def test_get_handle_of_unknown_run_raises() -> None:
    with pytest.raises(WorkflowNotFound, match="nope"):
        client.get_handle("nope")


def test_workflow_exception_fails_the_run_with_type_message_and_traceback() -> None:
    handle = client.start("tests.raises")
    assert drive(handle.run_id) == "failed"
    with pytest.raises(WorkflowFailed) as info:
        handle.result(timeout=1)
    assert info.value.error_type == "KeyError"
    assert "missing thing" in info.value.error_message
    assert "Traceback" in info.value.error_traceback
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.failure_category == "application"


def test_result_timeout_on_a_waiting_run() -> None:
    handle = client.start("tests.sleepy", kwargs={"seconds": 30})
    make_engine().run_turn(handle.run_id)
    assert handle.status() == "waiting"
    started = time.monotonic()
    with pytest.raises(ResultTimeout) as info:
        handle.result(timeout=0.2)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, WeftError)
    assert 0.15 < time.monotonic() - started < 2


def test_continue_as_new_chains_runs_and_result_follows() -> None:
    handle = client.start("tests.countdown", args=[3], id="countdown")
    engine = make_engine()
    for _ in range(10):
        for run_id in WorkflowRun.objects.filter(status="running").values_list("pk", flat=True):
            engine.run_turn(str(run_id))
    assert handle.result(timeout=1) == "liftoff"
    statuses = list(
        WorkflowRun.objects.filter(workflow_id="countdown")
        .order_by("created_at")
        .values_list("status", flat=True)
    )
    assert statuses == ["continued", "continued", "continued", "completed"]
    assert client.get_handle("countdown").result() == "liftoff"


# -- retries --------------------------------------------------------------------------------


def test_activity_failing_twice_then_succeeding_records_attempt_3() -> None:
    handle = client.start("tests.flaky", args=["fl", 2])
    assert drive(handle.run_id) == "completed"
    assert handle.result() == 3
    step = Step.objects.get(run_id=handle.run_id, seq=0)
    assert step.status == "completed" and step.attempt == 3
    assert side_effects("fl:") == {"fl:attempt1": 1, "fl:attempt2": 1, "fl:attempt3": 1}


def test_non_retryable_error_fails_the_run_at_once() -> None:
    handle = client.start("tests.declined", args=["nr"])
    assert drive(handle.run_id) == "failed"
    assert side_effects("nr") == {"nr": 1}
    with pytest.raises(WorkflowFailed) as info:
        handle.result()
    assert info.value.error_type.endswith("PaymentDeclined")
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.failure_category == "activity" and run.error["attempt"] == 1
    assert Step.objects.get(run_id=handle.run_id).status == "failed"


def test_exhausted_attempts_fail_the_run_with_the_last_error() -> None:
    handle = client.start("tests.always_fails", args=["ex"])
    assert drive(handle.run_id) == "failed"
    assert side_effects("ex") == {"ex": 3}
    with pytest.raises(WorkflowFailed) as info:
        handle.result()
    assert info.value.error_type == "ValueError"
    assert info.value.error_message == "boom on attempt 3"


@override_settings(WEFT_RETRY_INLINE_MAX_DELAY=0.1)
def test_long_retry_wait_parks_with_a_durable_retry_timer() -> None:
    handle = client.start("tests.durable_retry", args=["dr"])
    engine = make_engine()
    engine.run_turn(handle.run_id)
    assert handle.status() == "waiting"
    step = Step.objects.get(run_id=handle.run_id, seq=0)
    assert step.status == "retrying" and step.attempt == 1 and "first attempt" in step.error["message"]
    timer = Timer.objects.get(run_id=handle.run_id)
    assert timer.kind == "retry" and timer.fired_at is None
    assert drive(handle.run_id, engine=engine) == "completed"
    assert handle.result() == 2
    assert Step.objects.get(run_id=handle.run_id, seq=0).attempt == 2


# -- durable sleep and recorded values -------------------------------------------------------


def test_sleep_parks_then_resumes_after_fire_time() -> None:
    handle = client.start("tests.sleepy", kwargs={"seconds": 0.3})
    engine = make_engine()
    engine.run_turn(handle.run_id)
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.status == "waiting" and run.owner_id is None and run.waiting_on["kind"] == "sleep"
    assert engine.run_turn(handle.run_id) == "not_claimed"  # not due yet
    assert drive(handle.run_id, engine=engine) == "completed"
    sleep_step = Step.objects.get(run_id=handle.run_id, kind="sleep")
    assert sleep_step.status == "completed"
    assert side_effects("sleepy:") == {"sleepy:before": 1, "sleepy:after": 1}


def test_recorded_values_replay_identically_and_logger_is_silent_on_replay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="django_weft.workflow")
    handle = client.start("tests.recorded_values")
    engine = make_engine()
    engine.run_turn(handle.run_id)
    assert handle.status() == "waiting"
    assert drive(handle.run_id, engine=engine) == "completed"
    values = handle.result()
    recorded = {s.name: s.result for s in Step.objects.filter(run_id=handle.run_id, kind="side_effect")}
    assert values["uuid"] == recorded["uuid4"] and values["random"] == recorded["random"]
    assert values["now"] == recorded["now"]
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("django_weft.workflow")]
    assert sum("computing values" in m for m in messages) == 1
    assert sum("after the sleep" in m for m in messages) == 1


def test_delayed_start_is_pending_until_due() -> None:
    handle = client.start("tests.echo", args=["late"], start_delay="300ms")
    assert handle.status() == "pending"
    assert make_engine().run_turn(handle.run_id) == "not_claimed"
    assert drive(handle.run_id) == "completed"


# -- non-determinism and patching -------------------------------------------------------------


@pytest.fixture
def order_flags():  # type: ignore[no-untyped-def]
    saved = dict(wf.ORDER)
    yield wf.ORDER
    wf.ORDER.update(saved)


def test_changed_step_order_fails_with_nondeterminism_error(order_flags: dict[str, bool]) -> None:
    handle = client.start("tests.reorder")
    engine = make_engine()
    engine.run_turn(handle.run_id)
    assert handle.status() == "waiting"
    order_flags["swap"] = True  # "deploy" code that runs b before a
    assert drive(handle.run_id, engine=engine) == "failed"
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.failure_category == "nondeterminism"
    assert run.error["position"] == 0
    assert run.error["recorded"] == {"kind": "activity", "name": "tests.a"}
    assert run.error["requested"] == {"kind": "activity", "name": "tests.b"}
    assert "position 0" in run.error["message"] and "tests.a" in run.error["message"]
    with pytest.raises(WorkflowFailed) as info:
        handle.result()
    assert info.value.error_type == NonDeterminismError.__module__ + ".NonDeterminismError"
    assert Step.objects.filter(run_id=handle.run_id).count() == 3  # nothing recorded after the mismatch


def test_patched_lets_the_same_change_ship_safely(order_flags: dict[str, bool]) -> None:
    old = client.start("tests.reorder")
    engine = make_engine()
    engine.run_turn(old.run_id)  # recorded a, b, sleep under the old code
    order_flags["patched"] = True  # deploy the change guarded by ctx.patched
    new = client.start("tests.reorder")
    assert drive(old.run_id, engine=engine) == "completed"
    assert drive(new.run_id, engine=engine) == "completed"
    assert old.result() == ["a", "b", "c"]  # the old run keeps the old path
    assert new.result() == ["b", "a", "c"]  # new runs take the new one
    marker = Step.objects.get(run_id=new.run_id, kind="patch")
    assert marker.name == "b-before-a" and marker.seq == 0
    assert not Step.objects.filter(run_id=old.run_id, kind="patch").exists()


# -- idempotent start -----------------------------------------------------------------------------


def test_twenty_concurrent_starts_with_one_id_create_one_run() -> None:
    barrier = threading.Barrier(20)

    def start(_: int) -> str:
        barrier.wait()
        return client.start("tests.echo", args=[1], id="x").run_id

    handles = in_threads(start, 20)
    assert WorkflowRun.objects.filter(workflow_id="x").count() == 1
    assert len(set(handles)) == 1 and len(handles) == 20


def test_on_conflict_policies() -> None:
    first = client.start("tests.echo", id="dup")
    assert client.start("tests.echo", id="dup").run_id == first.run_id
    with pytest.raises(WorkflowAlreadyExists, match="dup"):
        client.start("tests.echo", id="dup", on_conflict="fail")
    assert client.start("tests.echo", id="dup", on_conflict="start_new_if_terminal").run_id == first.run_id
    drive(first.run_id)
    second = client.start("tests.echo", id="dup", on_conflict="start_new_if_terminal")
    assert second.run_id != first.run_id
    assert client.get_handle("dup").run_id == second.run_id
    assert client.start("tests.echo", id="dup").run_id == second.run_id


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "fragment"),
    [
        (
            lambda: client.start("tests.nope"),
            WorkflowNotRegistered,
            "no workflow is registered under the name 'tests.nope'",
        ),
        (lambda: client.start("tests.echo", args=[object()]), PayloadError, "args must be JSON-serialisable"),
        (
            lambda: client.start("tests.echo", kwargs={"when": {1, 2}}),
            PayloadError,
            "kwargs must be JSON-serialisable",
        ),
        (lambda: client.start("tests.echo", id="x" * 256), InvalidInput, "limit is 255"),
        (lambda: client.start("tests.echo", id=""), InvalidInput, "must not be empty"),
        (
            lambda: client.start("tests.echo", execution_timeout="5 parsecs"),
            InvalidDuration,
            "unknown unit 'parsecs'",
        ),
        (lambda: client.start("tests.echo", start_delay="soon"), InvalidDuration, "'soon' is not a duration"),
        (lambda: client.start("tests.echo", start_delay=-1), InvalidDuration, "must not be negative"),
        (
            lambda: client.start("tests.echo", on_conflict="replace"),
            InvalidInput,
            "on_conflict must be one of",
        ),
        (lambda: client.start("tests.echo", args="abc"), InvalidInput, "args must be a list"),
    ],
)
def test_bad_input_raises_a_clear_weft_error_and_writes_nothing(call, error, fragment) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, WeftError)
    assert fragment in str(info.value)
    assert WorkflowRun.objects.count() == 0 and Timer.objects.count() == 0


@pytest.mark.parametrize(
    ("args", "kwargs", "problem"),
    [
        ([], {}, "missing a required argument: 'n'"),
        ([1, 2], {}, "too many positional arguments"),
        ([1], {"m": 2}, "got an unexpected keyword argument 'm'"),
        ([1], {"n": 2}, "multiple values for argument 'n'"),
    ],
    ids=["missing", "extra", "unexpected-keyword", "twice"],
)
def test_arguments_that_do_not_fit_the_signature_are_refused_at_start(args, kwargs, problem) -> None:  # type: ignore[no-untyped-def]
    from django_weft import WorkflowArgumentsError

    for start in (
        lambda: client.start("tests.countdown", args=args, kwargs=kwargs, id="fit"),
        lambda: client.signal_with_start("tests.countdown", args=args, kwargs=kwargs, id="fit", signal="go"),
    ):
        with pytest.raises(WorkflowArgumentsError) as info:
            start()
        assert isinstance(info.value, InvalidInput)
        assert "workflow 'tests.countdown' cannot be started" in str(info.value)
        assert problem in str(info.value) and "(n: 'int')" in str(info.value)
    assert WorkflowRun.objects.count() == 0 and Timer.objects.count() == 0
    client.start("tests.countdown", kwargs={"n": 1})  # what fits is accepted
    client.start("tests.echo", args=[1, 2], kwargs={"any": "thing"})  # *args, **kwargs take anything


@override_settings(WEFT_MAX_PAYLOAD_BYTES=100)
def test_payload_over_the_limit_is_rejected() -> None:
    with pytest.raises(PayloadError, match="over the limit of 100 bytes"):
        client.start("tests.echo", args=["x" * 200])
    assert WorkflowRun.objects.count() == 0


def test_a_worker_that_does_not_know_the_workflow_leaves_the_run_untouched() -> None:
    from django_weft.engine.registry import registry

    handle = client.start("tests.echo")
    before = WorkflowRun.objects.values().get(pk=handle.run_id)
    definition = registry.workflows.pop("tests.echo")
    try:
        for _ in range(3):
            assert make_engine().run_turn(handle.run_id) == "not_claimed"
    finally:
        registry.workflows["tests.echo"] = definition
    # Not claimed and released: no write at all, the epoch has not moved.
    assert WorkflowRun.objects.values().get(pk=handle.run_id) == before
    assert before["owner_epoch"] == 0 and before["owner_id"] is None
    assert drive(handle.run_id) == "completed"
    assert WorkflowRun.objects.get(pk=handle.run_id).owner_epoch == 1


def test_an_unwinding_turned_into_another_exception_still_parks() -> None:
    handle = client.start("tests.converts_unwinding")
    assert make_engine().run_turn(handle.run_id) == "parked"
    assert handle.status() == "waiting"


def test_finishing_before_the_recorded_history_ends_is_nondeterminism() -> None:
    handle = client.start("tests.trailing")
    engine = make_engine()
    assert engine.run_turn(handle.run_id) == "parked"
    wf.SHAPE["drop_tail"] = True
    try:
        assert drive(handle.run_id, engine=engine) == "failed"
    finally:
        wf.SHAPE["drop_tail"] = False
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.failure_category == "nondeterminism" and run.error["position"] == 1
    assert run.error["recorded"] == {"kind": "sleep", "name": "sleep"}


def test_a_due_delayed_start_is_claimed_by_its_turn_without_a_sweep() -> None:
    handle = client.start("tests.echo", start_delay=0.1)
    time.sleep(0.15)
    assert make_engine().run_turn(handle.run_id) == "completed"


@override_settings(WEFT_MAX_PAYLOAD_BYTES=100)
def test_payload_limit_counts_utf8_bytes_not_characters() -> None:
    with pytest.raises(PayloadError, match="over the limit of 100 bytes"):
        client.start("tests.echo", args=["é" * 60])  # 60 characters, 120 bytes
    client.start("tests.echo", args=["e" * 60])
