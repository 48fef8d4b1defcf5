"""Deposition: only the current epoch's writes survive; a stale owner writes nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from django_weft.engine.errors import Deposed
from django_weft.engine.executor import TurnOutcome
from django_weft.engine.fencing import Fence
from django_weft.engine.records import StepKind, StepStatus, StepWrite

from .conftest import Harness

MOMENT = datetime(2030, 1, 1, tzinfo=UTC)


def step(seq: int) -> StepWrite:
    return StepWrite(seq, StepKind.SIDE_EFFECT, "x", StepStatus.COMPLETED, None, "1", None, 1, MOMENT, MOMENT)


def test_a_stale_epochs_commit_raises_deposed_and_writes_nothing(weft: Harness) -> None:
    run_id = weft.store.start("deposition.any")
    old = weft.store.claim(run_id, "old", ttl=30, grace=10)
    assert old is not None and old.epoch == 1
    assert weft.store.claim(run_id, "new", ttl=30, grace=10) is None  # the lease is live

    weft.store.advance(41)  # the lease ran out more than the grace period ago
    new = weft.store.claim(run_id, "new", ttl=30, grace=10)
    assert new is not None and new.epoch == 2

    with pytest.raises(Deposed):
        weft.store.commit_step(run_id, "old", old.epoch, step(0))
    with pytest.raises(Deposed):
        weft.store.park(run_id, "old", old.epoch, {"kind": "sleep"}, [step(0)], [])
    with pytest.raises(Deposed):
        weft.store.complete(run_id, "old", old.epoch, "null")
    assert weft.store.history(run_id) == []
    assert weft.store.runs[run_id].status == "running" and weft.store.runs[run_id].owner == "new"

    weft.store.commit_step(run_id, "new", new.epoch, step(0))
    assert len(weft.store.history(run_id)) == 1


def test_a_turn_that_loses_its_run_mid_activity_stops_and_records_nothing(weft: Harness) -> None:
    executed: list[str] = []

    def take_over() -> str:
        executed.append("charge")
        # Another engine takes the run over while this activity runs (an expired lease).
        run = weft.store.runs[run_id]
        run.owner, run.epoch = "engine-2", run.epoch + 1
        return "charged"

    def ship() -> str:
        executed.append("ship")
        return "shipped"

    @weft.workflow("deposition.order")
    def order(ctx: Any) -> list[str]:
        try:
            return [ctx.run(take_over), ctx.run(ship)]
        except Exception:  # a saga's compensation may not keep a deposed engine going
            return [ctx.run(ship)]

    run_id = weft.store.start("deposition.order")
    assert weft.turn(run_id) == TurnOutcome.DEPOSED
    assert executed == ["charge"]
    assert weft.store.history(run_id) == []
    assert weft.engine.held() == {}


def test_the_fence_turns_deposed_into_the_turns_stop() -> None:
    stopped: list[Deposed] = []

    class Stop(BaseException):
        pass

    def on_deposed(exc: Deposed) -> Any:
        stopped.append(exc)
        raise Stop

    def refused(run_id: str, owner: str, epoch: int, seq: int) -> None:
        raise Deposed(f"run {run_id}: epoch {epoch} of {owner} is stale", run_id=run_id)

    def accepted(run_id: str, owner: str, epoch: int, seq: int) -> tuple[str, str, int, int]:
        return run_id, owner, epoch, seq

    fence = Fence("r", "me", 3, on_deposed)
    assert fence.write(accepted, 7) == ("r", "me", 3, 7)
    with pytest.raises(Stop):
        fence.write(refused, 7)
    assert [exc.message for exc in stopped] == ["run r: epoch 3 of me is stale"]
