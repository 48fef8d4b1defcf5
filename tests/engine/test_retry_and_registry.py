from __future__ import annotations

import pickle

import pytest

from django_weft import (
    ActivityFailed,
    ConfigurationError,
    Deposed,
    DuplicateRegistration,
    NonDeterminismError,
    RetryPolicy,
    WorkflowFailed,
    WorkflowNotRegistered,
)
from django_weft.engine.registry import Registry, activity, registry, workflow


def test_retry_delays_grow_and_are_capped() -> None:
    policy = RetryPolicy(max_attempts=6, initial_interval="1s", backoff=2, max_interval="5s")
    assert [policy.delay_after(n) for n in range(1, 6)] == [1, 2, 4, 5, 5]


def test_default_policy_matches_the_contract() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.initial_interval, policy.backoff, policy.max_interval) == (
        3,
        1.0,
        2.0,
        60.0,
    )


def test_non_retryable_types() -> None:
    policy = RetryPolicy(non_retryable=(KeyError,))
    assert not policy.is_retryable(KeyError("x"))
    assert policy.is_retryable(ValueError("x"))


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"backoff": 0.5}, {"initial_interval": "never"}])
def test_invalid_policies_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_duplicate_names_are_rejected_with_both_functions_named() -> None:
    def first(ctx: object) -> None: ...

    def second(ctx: object) -> None: ...

    workflow(first, name="tests.engine.dup")
    try:
        with pytest.raises(
            DuplicateRegistration, match=r"already registered by .*first; .*second cannot use it"
        ):
            workflow(second, name="tests.engine.dup")
        workflow(first, name="tests.engine.dup")  # the same function again is fine (re-import)
    finally:
        registry.unregister("tests.engine.dup")


def test_duplicate_activity_names_are_rejected() -> None:
    def one() -> None: ...

    def two() -> None: ...

    activity(one, name="tests.engine.act")
    try:
        with pytest.raises(DuplicateRegistration):
            activity(two, name="tests.engine.act")
    finally:
        registry.unregister("tests.engine.act")


def test_unknown_workflow_lists_registered_names() -> None:
    local = Registry()
    with pytest.raises(WorkflowNotRegistered, match=r"'missing' \(registered: none\)"):
        local.get_workflow("missing")


def test_activity_called_directly_is_a_plain_call() -> None:
    @activity(name="tests.engine.double")
    def double(x: int) -> int:
        return 2 * x

    try:
        assert double(4) == 8
    finally:
        registry.unregister("tests.engine.double")


@pytest.mark.parametrize(
    "error",
    [
        NonDeterminismError("msg", position=3, recorded={"kind": "a"}, requested={"kind": "b"}),
        WorkflowFailed("failed", error_type="KeyError", error_message="x", error_traceback="tb"),
        ActivityFailed(
            "af", activity="a", seq=1, attempt=2, cause_type="E", cause_message="m", cause_traceback=""
        ),
        Deposed("gone", run_id="r", owner="o", epoch=3),
    ],
)
def test_errors_pickle_with_their_attributes(error: Exception) -> None:
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is type(error) and str(clone) == str(error)
    assert clone.__dict__ == error.__dict__


def test_arguments_are_checked_against_the_function_as_called_not_the_one_it_wraps() -> None:
    import functools

    from django_weft import WorkflowArgumentsError

    def injects_tenant(fn):  # type: ignore[no-untyped-def]
        @functools.wraps(fn)
        def wrapper(ctx, *args, **kwargs):  # type: ignore[no-untyped-def]
            return fn(ctx, "tenant-1", *args, **kwargs)

        return wrapper

    @workflow(name="tests.engine.injected")
    @injects_tenant
    def injected(ctx, tenant, order_id):  # type: ignore[no-untyped-def]
        return [tenant, order_id]

    @workflow(name="tests.engine.plain")
    def plain(ctx, order_id, *, note=None):  # type: ignore[no-untyped-def]
        return order_id

    try:
        injected.check_arguments([42], {})  # the wrapper takes anything
        plain.check_arguments([42], {"note": "x"})
        with pytest.raises(WorkflowArgumentsError, match="unexpected keyword argument 'nope'"):
            plain.check_arguments([42], {"nope": 1})
        with pytest.raises(WorkflowArgumentsError, match="too many positional"):
            plain.check_arguments([42, "x"], {})
    finally:
        registry.unregister("tests.engine.injected")
        registry.unregister("tests.engine.plain")
