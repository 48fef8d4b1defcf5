"""Non-determinism: code that asks for another operation than the recorded one is held."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from django_weft.engine.errors import NonDeterminismError
from django_weft.engine.executor import TurnOutcome
from django_weft.engine.records import FailureCategory, RunStatus

from .conftest import Harness


def reserve() -> str:
    return "reserved"


def charge() -> str:
    return "charged"


def deploy_v1(weft: Harness) -> str:
    @weft.workflow("nd.order")
    def v1(ctx: Any) -> None:
        ctx.run(reserve)
        ctx.sleep(60)

    run_id = weft.store.start("nd.order")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.advance(61)
    return run_id


@pytest.mark.parametrize(
    ("first_operation", "requested"),
    [
        (lambda ctx: ctx.run(charge), {"kind": "activity", "name": f"{__name__}.charge"}),
        (lambda ctx: ctx.side_effect(reserve, name=f"{__name__}.reserve"),
         {"kind": "side_effect", "name": f"{__name__}.reserve"}),
    ],
    ids=["another name", "another kind"],
)  # fmt: skip
def test_a_changed_step_at_a_position_holds_the_run(
    weft: Harness, first_operation: Any, requested: dict[str, str]
) -> None:
    run_id = deploy_v1(weft)

    @weft.workflow("nd.order")
    def v2(ctx: Any) -> None:
        first_operation(ctx)
        ctx.sleep(60)

    claimed = weft.store.claim(run_id, "reader", ttl=30, grace=0)
    assert claimed is not None
    with pytest.raises(NonDeterminismError, match="is not deterministic: at position 0") as info:
        weft.engine.replay_read_only(claimed)
    error = info.value
    assert error.run_id == run_id and error.position == 0
    assert error.recorded == {"kind": "activity", "name": f"{__name__}.reserve"}
    assert error.requested == requested
    weft.store.release(run_id, "reader", claimed.epoch)

    assert weft.turn(run_id) == TurnOutcome.FAILED
    run = weft.store.runs[run_id]
    assert (run.status, run.failure_category) == (RunStatus.FAILED, FailureCategory.NONDETERMINISM)
    assert run.error is not None
    assert (run.error["position"], run.error["recorded"], run.error["requested"]) == (
        0,
        {"kind": "activity", "name": f"{__name__}.reserve"},
        requested,
    )
    assert len(weft.history(run_id)) == 2  # nothing recorded past the divergence


def test_removed_operations_are_caught_when_the_function_returns(weft: Harness) -> None:
    run_id = deploy_v1(weft)

    @weft.workflow("nd.order")
    def v2(ctx: Any) -> None:
        return None

    assert weft.turn(run_id) == TurnOutcome.FAILED
    error = weft.store.runs[run_id].error
    assert error is not None
    assert error["position"] == 0 and error["requested"] == {"kind": "finish", "name": ""}
    assert "the workflow finished at position 0" in error["message"]


def test_workflow_code_cannot_swallow_the_error(weft: Harness) -> None:
    run_id = deploy_v1(weft)

    @weft.workflow("nd.order")
    def v2(ctx: Any) -> str:
        with contextlib.suppress(Exception):
            ctx.run(charge)
        return "carried on"

    assert weft.turn(run_id) == TurnOutcome.FAILED
    assert weft.store.runs[run_id].failure_category == FailureCategory.NONDETERMINISM
