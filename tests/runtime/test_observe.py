"""The observation points fire once per real event, never for a step replayed from its
record, and an observer that raises does not break a run."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from django_weft import client
from django_weft.engine import observe
from django_weft.engine.executor import TurnOutcome
from django_weft.runtime import tick
from django_weft.runtime.dispatch import SweepOnlyDispatcher
from django_weft.runtime.messages import accept_update
from django_weft.runtime.schedules.firing import trigger_schedule
from django_weft.testing import drive, make_engine, run_queued_activities
from tests.support.driver import depose_by_takeover
from tests.testapp import observe_workflows

pytestmark = pytest.mark.django_db(transaction=True)


class Recorder(observe.Observer):
    """Every point's call, as ``(point, details)``, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def _add(self, point: str, **details: Any) -> None:
        with self._lock:
            self.events.append((point, details))

    def of(self, point: str) -> list[dict[str, Any]]:
        return [details for name, details in self.events if name == point]

    def run_started(self, **details: Any) -> None:
        self._add("run_started", **details)

    def turn_started(self, scope: observe.TurnScope) -> None:
        self._add("turn_started", run_id=scope.claimed.run_id, takeover=scope.takeover)

    def turn_finished(self, scope: observe.TurnScope) -> None:
        self._add("turn", run_id=scope.claimed.run_id, outcome=scope.outcome, takeover=scope.takeover)

    def attempt_started(self, scope: observe.AttemptScope) -> None:
        self._add("attempt_started", activity=scope.info.activity_name, attempt=scope.info.attempt)

    def attempt_finished(self, scope: observe.AttemptScope) -> None:
        info = scope.info
        self._add("attempt", activity=info.activity_name, seq=info.seq, attempt=info.attempt,
                  inline=scope.inline, outcome=scope.outcome, error=scope.error)  # fmt: skip

    def schedule_to_start(self, **details: Any) -> None:
        self._add("schedule_to_start", **details)

    def message_finished(self, scope: observe.MessageScope) -> None:
        self._add("message", kind=scope.kind, name=scope.name, run_id=scope.run_id, outcome=scope.outcome)

    def timer_fired(self, **details: Any) -> None:
        self._add("timer_fired", **details)

    def schedule_fired(self, **details: Any) -> None:
        self._add("schedule_fired", **details)

    def lease_taken_over(self, **details: Any) -> None:
        self._add("lease_taken_over", **details)

    def deposed_write(self, **details: Any) -> None:
        self._add("deposed_write", **details)

    def run_finished(self, **details: Any) -> None:
        self._add("run_finished", **details)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recorder = Recorder()
    observe.add_observer(recorder)
    try:
        yield recorder
    finally:
        observe.remove_observer(recorder)


def test_each_point_fires_once_per_real_event_and_never_for_a_replayed_step(recorder: Recorder) -> None:
    observe_workflows.failures["once"] = 1  # the flaky activity's first attempt fails
    handle = client.start("tests.obs.steps", args=["once"])
    engine = make_engine("obs-engine")
    sweep = SweepOnlyDispatcher()
    # Turn 1: echo, flaky (failed, retried inline), then parked on the sleep.
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED
    time.sleep(0.1)
    tick(sweep)  # the sleep's timer fires
    # Turn 2: replays echo and flaky, schedules the queued activity.
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED
    assert run_queued_activities(handle.run_id) == 1
    # Turn 3: replays everything so far, parks on the signal.
    assert engine.run_turn(handle.run_id) == TurnOutcome.PARKED
    client.get_handle(handle.run_id).signal("go", "now")
    # Turn 4: replays everything, completes.
    assert engine.run_turn(handle.run_id) == TurnOutcome.COMPLETED
    assert handle.result(timeout=1) == ["once", "once", "once", "now"]

    assert [(e["workflow"], e["run_id"]) for e in recorder.of("run_started")] == [
        ("tests.obs.steps", handle.run_id)
    ]
    assert [e["outcome"] for e in recorder.of("turn")] == ["parked", "parked", "parked", "completed"]
    # One attempt event per real attempt: echo once, flaky twice (retried, then
    # completed), the queued activity once; none for the replays of turns 2 to 4.
    assert [(e["activity"], e["attempt"], e["outcome"], e["inline"]) for e in recorder.of("attempt")] == [
        ("tests.obs.echo", 1, "completed", True),
        ("tests.obs.flaky", 1, "retried", True),
        ("tests.obs.flaky", 2, "completed", True),
        ("tests.obs.queued", 1, "completed", False),
    ]
    assert recorder.of("attempt")[1]["error"]["type"] == "RuntimeError"
    assert len(recorder.of("attempt_started")) == 4
    # One observation per claim: the first turn, three woken turns, one queued attempt.
    kinds = Counter(e["kind"] for e in recorder.of("schedule_to_start"))
    assert kinds == {"first_turn": 1, "woken": 3, "activity": 1}
    assert all(e["delay"] >= 0 for e in recorder.of("schedule_to_start"))
    assert [(e["kind"], e["seq"]) for e in recorder.of("timer_fired")] == [("sleep", 2)]
    assert [(e["kind"], e["name"], e["outcome"]) for e in recorder.of("message")] == [
        ("signal", "go", "stored")
    ]
    assert recorder.of("run_finished") == [
        {"run_id": handle.run_id, "workflow_id": handle.workflow_id, "workflow": "tests.obs.steps",
         "status": "completed"}
    ]  # fmt: skip
    assert not recorder.of("lease_taken_over") and not recorder.of("deposed_write")


def test_queries_and_updates_are_observed_with_their_run(recorder: Recorder) -> None:
    handle = client.start("tests.m.query_guard", args=["obs"])
    drive_until_parked = make_engine()
    assert drive_until_parked.run_turn(handle.run_id) == TurnOutcome.PARKED
    assert handle.query("stage") == "waiting"
    with pytest.raises(Exception):  # noqa: B017  (the handler's name is unknown)
        handle.query("nope")
    messages = recorder.of("message")
    assert [(m["kind"], m["name"], m["outcome"], m["run_id"]) for m in messages] == [
        ("query", "stage", "answered", handle.run_id),
        ("query", "nope", "error", handle.run_id),
    ]


def test_updates_are_observed(recorder: Recorder) -> None:
    handle = client.start("tests.m.sleep_with_handlers", args=[30])
    assert make_engine().run_turn(handle.run_id) == TurnOutcome.PARKED
    handle.signal("note", 1)
    accept_update(handle.run_id, "notes", None)
    kinds = [(m["kind"], m["name"], m["outcome"]) for m in recorder.of("message")]
    assert kinds == [("signal", "note", "stored"), ("update", "notes", "accepted")]


def test_an_observer_that_raises_does_not_break_a_run(recorder: Recorder, caplog: Any) -> None:
    class Broken(observe.Observer):
        def turn_started(self, scope: observe.TurnScope) -> None:
            raise RuntimeError("broken observer")

        def attempt_finished(self, scope: observe.AttemptScope) -> None:
            raise RuntimeError("broken observer")

        def run_started(self, **details: Any) -> None:
            raise RuntimeError("broken observer")

    broken = Broken()
    observe.add_observer(broken)
    try:
        handle = client.start("tests.obs.plain", args=[3])
        assert drive(handle.run_id) == "completed"
    finally:
        observe.remove_observer(broken)
    assert handle.result(timeout=1) == 3
    assert len(recorder.of("attempt")) == 3  # the other observer still heard everything
    assert "broken observer" in caplog.text


def test_no_observer_means_the_points_hand_back_one_shared_no_op() -> None:
    assert observe.observers() == ()
    with observe.turn(None, "e", takeover=False) as seen:  # type: ignore[arg-type]
        seen.outcome = "parked"  # dropped
    assert observe.start_carrier() is None
    assert observe.turn(None, "e", takeover=False) is observe.turn(None, "f", takeover=True)  # type: ignore[arg-type]


def test_a_schedule_fire_is_observed_with_its_outcome(recorder: Recorder) -> None:
    client.create_schedule("obs-hourly", "tests.obs.plain", args=[1], every="1h")
    trigger_schedule("obs-hourly")
    fires = recorder.of("schedule_fired")
    assert fires and fires[0]["schedule_id"] == "obs-hourly" and fires[0]["outcome"] == "started"
    assert fires[0]["workflow"] == "tests.obs.plain" and fires[0]["run_id"]
    assert [e["run_id"] for e in recorder.of("run_started")] == [fires[0]["run_id"]]


@pytest.mark.postgres
def test_a_takeover_and_the_stale_owners_refused_write_are_observed(recorder: Recorder) -> None:
    handle = client.start("tests.fence_probe", args=["obs"])
    assert depose_by_takeover(handle.run_id, "obs-A", "obs-B") == (TurnOutcome.DEPOSED, TurnOutcome.COMPLETED)
    assert recorder.of("lease_taken_over") == [
        {"run_id": handle.run_id, "workflow": "tests.fence_probe", "engine_id": "obs-B", "epoch": 2}
    ]
    assert recorder.of("deposed_write") == [{"run_id": handle.run_id, "engine_id": "obs-A", "epoch": 1}]
    turns = sorted((e["outcome"], e["takeover"]) for e in recorder.of("turn"))
    assert turns == [("completed", True), ("deposed", False)]
    kinds = Counter(e["kind"] for e in recorder.of("schedule_to_start"))
    assert kinds == {"first_turn": 1, "takeover": 1}
    # A's attempt at position 1 ran to its end, but the write of its record (held back
    # until the turn's next operation) was refused: the turn says so. B's ran again.
    outcomes = sorted((e["seq"], e["outcome"]) for e in recorder.of("attempt"))
    assert outcomes == [(0, "completed"), (1, "completed"), (1, "completed"), (2, "completed")]
