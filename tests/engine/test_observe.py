"""The observation points on the in-memory store, no Django: once per real event, never
for a replayed step; a deposed turn and its refused write; observers that raise are
ignored; no observer, no work."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from django_weft.engine import observe
from django_weft.engine.executor import TurnOutcome

from .conftest import Harness


class Recorder(observe.Observer):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def turn_finished(self, scope: observe.TurnScope) -> None:
        self.events.append(("turn", scope.outcome, scope.takeover))

    def attempt_finished(self, scope: observe.AttemptScope) -> None:
        name = scope.info.activity_name.rsplit(".", 1)[-1]
        self.events.append(("attempt", name, scope.info.attempt, str(scope.outcome)))

    def schedule_to_start(self, *, kind: str, delay: float, **_: Any) -> None:
        self.events.append(("claim", str(kind)))

    def lease_taken_over(self, *, epoch: int, **_: Any) -> None:
        self.events.append(("takeover", epoch))

    def deposed_write(self, *, epoch: int, **_: Any) -> None:
        self.events.append(("deposed", epoch))

    def run_finished(self, *, status: str, **_: Any) -> None:
        self.events.append(("finished", status))


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recorder = Recorder()
    observe.add_observer(recorder)
    yield recorder
    observe.remove_observer(recorder)


def test_replayed_steps_emit_nothing_and_each_real_attempt_once(weft: Harness, recorder: Recorder) -> None:
    calls: list[int] = []

    def step(value: int) -> int:
        calls.append(value)
        return value

    @weft.workflow("observe.sleepy")
    def sleepy(ctx: Any) -> int:
        first = ctx.run(step, 1)
        ctx.sleep(5)
        return first + ctx.run(step, 2)

    run_id = weft.store.start("observe.sleepy")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.advance(6)
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert calls == [1, 2]
    assert [e for e in recorder.events if e[0] == "attempt"] == [
        ("attempt", "step", 1, "completed"),
        ("attempt", "step", 1, "completed"),
    ]
    assert [e for e in recorder.events if e[0] != "attempt"] == [
        ("claim", "first_turn"),
        ("turn", "parked", False),
        ("claim", "woken"),
        ("turn", "completed", False),
        ("finished", "completed"),
    ]


def test_a_first_turn_after_a_claim_released_without_a_turn_is_still_the_first(
    weft: Harness, recorder: Recorder
) -> None:
    @weft.workflow("observe.once")
    def once(ctx: Any) -> int:
        return 1

    run_id = weft.store.start("observe.once")
    # A worker's sweep claimed it for a thread that did not take it in time: let go.
    claimed = weft.store.claim(run_id, weft.engine.engine_id, ttl=30, grace=10)
    assert claimed is not None
    weft.engine.hold(claimed)
    assert weft.engine.let_go(claimed)
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert [e for e in recorder.events if e[0] == "claim"] == [("claim", "first_turn")]


def test_a_deposed_turn_reports_its_refused_write_and_the_takeover(weft: Harness, recorder: Recorder) -> None:
    taken: list[bool] = []

    def take_over() -> str:
        if not taken:
            taken.append(True)
            weft.store.advance(60)  # the lease expires while the activity runs...
            assert weft.store.claim(run_id, "engine-2", ttl=30, grace=10) is not None  # ...and is taken over
        return "late"

    @weft.workflow("observe.deposed")
    def deposed(ctx: Any) -> str:
        return str(ctx.run(take_over))

    run_id = weft.store.start("observe.deposed")
    assert weft.turn(run_id) == TurnOutcome.DEPOSED
    # The attempt ran to its end; the write refused is the completion that records it.
    assert recorder.events == [
        ("claim", "first_turn"),
        ("attempt", "take_over", 1, "completed"),
        ("deposed", 1),
        ("turn", "deposed", False),
    ]
    # The store's own claim above is not a turn; a turn of this engine now is a takeover.
    weft.store.advance(60)
    recorder.events.clear()
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert recorder.events[:2] == [("takeover", 3), ("claim", "takeover")]


def test_an_observer_that_raises_is_logged_and_ignored(
    weft: Harness, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(observe.Observer):
        def turn_started(self, scope: observe.TurnScope) -> None:
            raise RuntimeError("broken observer")

        def attempt_finished(self, scope: observe.AttemptScope) -> None:
            raise RuntimeError("broken observer")

    @weft.workflow("observe.plain")
    def plain(ctx: Any) -> int:
        return int(ctx.run(lambda: 1))

    broken = Broken()
    observe.add_observer(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="django_weft.observe"):
            run_id = weft.store.start("observe.plain")
            assert weft.turn(run_id) == TurnOutcome.COMPLETED
    finally:
        observe.remove_observer(broken)
    assert ("finished", "completed") in recorder.events
    assert [r.getMessage().split(" failed in ")[1] for r in caplog.records] == [
        "turn_started; ignored",
        "attempt_finished; ignored",
    ]


def test_a_block_ends_with_the_observers_that_saw_it_begin(weft: Harness, recorder: Recorder) -> None:
    """Observers registered or removed inside an attempt's block: the one that saw its
    start sees its end, the one added halfway sees neither."""

    class Paired(observe.Observer):
        def __init__(self) -> None:
            self.seen: list[str] = []

        def attempt_started(self, scope: observe.AttemptScope) -> None:
            self.seen.append("started")

        def attempt_finished(self, scope: observe.AttemptScope) -> None:
            self.seen.append(f"finished {scope.outcome}")

    leaving, arriving = Paired(), Paired()

    def switch() -> int:
        observe.remove_observer(leaving)
        observe.add_observer(arriving)
        return 1

    @weft.workflow("observe.switch")
    def switching(ctx: Any) -> int:
        return int(ctx.run(switch))

    observe.add_observer(leaving)
    try:
        run_id = weft.store.start("observe.switch")
        assert weft.turn(run_id) == TurnOutcome.COMPLETED
    finally:
        observe.remove_observer(leaving)
        observe.remove_observer(arriving)
    assert leaving.seen == ["started", "finished completed"]
    assert arriving.seen == []
    assert ("attempt", "switch", 1, "completed") in recorder.events


def test_without_observers_a_point_is_one_shared_no_op() -> None:
    assert observe.observers() == ()
    first = observe.turn(None, "e", takeover=False)  # type: ignore[arg-type]
    assert first is observe.activity_attempt(None, queue=None, inline=True)  # type: ignore[arg-type]
    with first as seen:
        seen.outcome = "parked"  # dropped
    assert not hasattr(seen, "outcome")
    assert observe.start_carrier() is None
    assert not observe.wants_queue_samples()


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_an_observer_fills_the_carrier_a_start_stores() -> None:
    class Tracing(observe.Observer):
        def fill_carrier(self, carrier: dict[str, str]) -> None:
            carrier["traceparent"] = TRACEPARENT

    tracing = Tracing()
    observe.add_observer(tracing)
    try:
        assert observe.start_carrier() == {
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        }
    finally:
        observe.remove_observer(tracing)
    assert observe.start_carrier() is None
