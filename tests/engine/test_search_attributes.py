"""ctx.set_search_attributes: checked at the call, recorded as one step whose commit also
merges the run's attributes (fenced), not written again on replay."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest

from django_weft.engine import faults
from django_weft.engine.errors import InvalidInput, NonDeterminismError, PayloadError
from django_weft.engine.executor import TurnOutcome
from django_weft.engine.records import FailureCategory, RunStatus, StepKind
from django_weft.engine.search_attributes import check_search_attributes, step_name
from django_weft.engine.testing.memory_store import MemoryStore

from .conftest import Harness


def count_writes(store: MemoryStore) -> list[dict[str, Any]]:
    """Wrap the store's search-attribute write; the list receives each call's mapping."""
    writes: list[dict[str, Any]] = []
    original = store.set_search_attributes

    def counted(run_id: str, owner: str, epoch: int, step: Any, attributes: dict[str, Any]) -> None:
        writes.append(dict(attributes))
        original(run_id, owner, epoch, step, attributes)

    store.set_search_attributes = counted  # type: ignore[method-assign]
    return writes


# -- what the call accepts ------------------------------------------------------------------


def test_values_are_stored_typed_and_datetimes_as_utc_iso_text() -> None:
    oslo = timezone(timedelta(hours=1))
    checked = check_search_attributes(
        {
            "customer": 7,
            "tier": "gold",
            "score": 2.5,
            "vip": True,
            "gone": None,
            "due": datetime(2030, 1, 2, 3, 4, 5, tzinfo=oslo),
            "day": date(2030, 1, 2),
            "_x-1": "",
        }
    )
    assert checked == {
        "customer": 7,
        "tier": "gold",
        "score": 2.5,
        "vip": True,
        "gone": None,
        "due": "2030-01-02T02:04:05Z",
        "day": "2030-01-02",
        "_x-1": "",
    }
    assert checked["vip"] is True and type(checked["customer"]) is int


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ([("customer", 7)], "takes a dict"),
        ({7: "x"}, "must be a string"),
        ({"": 1}, "is not allowed"),
        ({"1st": 1}, "is not allowed"),
        ({"a b": 1}, "is not allowed"),
        ({"a__b": 1}, "is not allowed"),
        ({"a" * 101: 1}, "is not allowed"),
        ({"weft_schedule_id": "s"}, "is reserved"),
        ({"WEFT_x": "s"}, "is reserved"),
        ({"tags": ["a", "b"]}, "a list is not a search attribute value"),
        ({"tags": ("a",)}, "a tuple is not"),
        ({"address": {"city": "Oslo"}}, "a dict is not"),
        ({"score": math.nan}, "not a finite number"),
        ({"score": math.inf}, "not a finite number"),
        ({"big": 2**63}, "64-bit"),
        ({"due": datetime(2030, 1, 1)}, "has no timezone"),
        ({"blob": b"x"}, "bytes is not a search attribute value"),
    ],
)
def test_invalid_attributes_are_refused_with_what_to_fix(attributes: Any, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        check_search_attributes(attributes)


def test_the_step_name_is_the_sorted_names_cut_to_fit() -> None:
    assert step_name({"tier": 1, "customer": None}) == "customer,tier"
    long = step_name({f"{letter}" * 100: 1 for letter in "abc"})
    assert len(long) == 200 and long.endswith("\u2026")


# -- recorded and merged ----------------------------------------------------------------------


def test_attributes_merge_none_removes_and_one_step_each(weft: Harness) -> None:
    @weft.workflow("attrs.merge")
    def merge(ctx: Any) -> str:
        ctx.set_search_attributes({"customer": 7, "stage": "new", "temp": 1})
        ctx.set_search_attributes({"stage": "paid", "temp": None, "missing": None})
        ctx.set_search_attributes({})  # nothing to do, nothing recorded
        return "done"

    run_id = weft.store.start("attrs.merge")
    weft.store.runs[run_id].search_attributes = {"region": "north"}
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert weft.store.runs[run_id].search_attributes == {"region": "north", "customer": 7, "stage": "paid"}
    assert weft.history(run_id) == [
        (0, StepKind.SEARCH_ATTRIBUTES, "customer,stage,temp", "completed"),
        (1, StepKind.SEARCH_ATTRIBUTES, "missing,stage,temp", "completed"),
    ]
    assert weft.store.history(run_id)[1].args_json == '{"stage":"paid","temp":null,"missing":null}'


def test_replay_returns_without_writing_again(weft: Harness) -> None:
    writes = count_writes(weft.store)

    nows: list[datetime] = []

    @weft.workflow("attrs.replay")
    def replay(ctx: Any) -> Any:
        nows.append(ctx.now())
        ctx.set_search_attributes({"stage": "waiting", "since": nows[-1]})
        approval = ctx.wait_signal("approve")
        ctx.set_search_attributes({"stage": "approved"})
        return approval

    run_id = weft.store.start("attrs.replay")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    since = nows[0].astimezone(UTC).isoformat().replace("+00:00", "Z")
    assert weft.store.runs[run_id].search_attributes == {"stage": "waiting", "since": since}
    weft.store.signal(run_id, "approve", "ann")
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert writes == [{"stage": "waiting", "since": since}, {"stage": "approved"}]
    assert nows[0] == nows[1]  # the replay set the same value, and did not write it
    assert weft.store.runs[run_id].search_attributes == {"stage": "approved", "since": since}
    kinds = [(kind, name) for _, kind, name, _ in weft.history(run_id)]
    assert kinds.count((StepKind.SEARCH_ATTRIBUTES, "since,stage")) == 1
    assert kinds.count((StepKind.SEARCH_ATTRIBUTES, "stage")) == 1


def test_a_query_replays_the_step_and_writes_nothing(weft: Harness) -> None:
    writes = count_writes(weft.store)

    @weft.workflow("attrs.query")
    def query(ctx: Any) -> None:
        stage = {"now": "start"}
        ctx.on_query("stage", lambda: stage["now"])
        ctx.set_search_attributes({"stage": "waiting"})
        stage["now"] = "waiting"
        ctx.wait_signal("go")
        ctx.set_search_attributes({"stage": "went"})  # past the history: not reached by a query

    run_id = weft.store.start("attrs.query")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.runs[run_id].status = RunStatus.RUNNING  # so that the test can claim it to read
    read = weft.store.claim(run_id, "reader", ttl=30, grace=0)
    assert read is not None
    ctx = weft.engine.replay_read_only(read)
    assert ctx.query_handlers["stage"]() == "waiting"
    assert writes == [{"stage": "waiting"}]


def test_invalid_input_raises_in_the_workflow_before_anything_is_recorded(weft: Harness) -> None:
    caught: list[str] = []

    @weft.workflow("attrs.caught")
    def caught_it(ctx: Any) -> str:
        try:
            ctx.set_search_attributes({"tags": ["a"]})
        except InvalidInput as exc:
            caught.append(str(exc))
        ctx.set_search_attributes({"tags": "a,b"})
        return "ok"

    run_id = weft.store.start("attrs.caught")
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert caught and "a list is not a search attribute value" in caught[0]
    assert weft.history(run_id) == [(0, StepKind.SEARCH_ATTRIBUTES, "tags", "completed")]
    assert weft.store.runs[run_id].search_attributes == {"tags": "a,b"}


@pytest.mark.parametrize(
    ("value", "error_type"),
    [({"a__b": 1}, InvalidInput), ({"note": "nul\x00"}, PayloadError), ({"x": object()}, InvalidInput)],
    ids=["bad name", "NUL", "object"],
)
def test_uncaught_invalid_input_fails_the_run_like_any_exception(
    weft: Harness, value: dict[str, Any], error_type: type[Exception]
) -> None:
    @weft.workflow("attrs.uncaught")
    def uncaught(ctx: Any) -> None:
        ctx.set_search_attributes(value)

    run_id = weft.store.start("attrs.uncaught")
    assert weft.turn(run_id) == TurnOutcome.FAILED
    run = weft.store.runs[run_id]
    assert (run.status, run.failure_category) == (RunStatus.FAILED, FailureCategory.APPLICATION)
    assert run.error is not None and run.error["type"].endswith(error_type.__name__)
    assert weft.history(run_id) == [] and run.search_attributes == {}


@pytest.mark.parametrize(
    ("v2", "requested"),
    [
        (lambda ctx: ctx.set_search_attributes({"region": 1}), {"kind": "search_attrs", "name": "region"}),
        (lambda ctx: ctx.side_effect(lambda: 1, name="stage"), {"kind": "side_effect", "name": "stage"}),
    ],
    ids=["other names", "other operation"],
)
def test_a_changed_call_at_a_recorded_position_holds_the_run(
    weft: Harness, v2: Callable[[Any], Any], requested: dict[str, str]
) -> None:
    @weft.workflow("attrs.nd")
    def v1(ctx: Any) -> None:
        ctx.set_search_attributes({"stage": "one"})
        ctx.sleep(60)

    run_id = weft.store.start("attrs.nd")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.advance(61)

    @weft.workflow("attrs.nd")
    def changed(ctx: Any) -> None:
        v2(ctx)
        ctx.sleep(60)

    assert weft.turn(run_id) == TurnOutcome.FAILED
    run = weft.store.runs[run_id]
    assert run.failure_category == FailureCategory.NONDETERMINISM and run.error is not None
    assert run.error["recorded"] == {"kind": "search_attrs", "name": "stage"}
    assert run.error["requested"] == requested
    assert run.search_attributes == {"stage": "one"}


def test_the_same_names_with_other_values_replay_as_recorded(weft: Harness) -> None:
    writes = count_writes(weft.store)
    version = {"stage": "one"}

    @weft.workflow("attrs.values")
    def values(ctx: Any) -> None:
        ctx.set_search_attributes(dict(version))
        ctx.sleep(60)

    run_id = weft.store.start("attrs.values")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    version["stage"] = "two"  # a deploy changed the value, not the operation
    weft.store.advance(61)
    assert weft.turn(run_id) == TurnOutcome.COMPLETED
    assert writes == [{"stage": "one"}] and weft.store.runs[run_id].search_attributes == {"stage": "one"}


def test_a_recorded_call_is_a_non_determinism_where_the_code_now_does_something_else(weft: Harness) -> None:
    @weft.workflow("attrs.removed")
    def v1(ctx: Any) -> None:
        ctx.side_effect(lambda: 1, name="first")
        ctx.sleep(60)

    run_id = weft.store.start("attrs.removed")
    assert weft.turn(run_id) == TurnOutcome.PARKED
    weft.store.advance(61)

    @weft.workflow("attrs.removed")
    def v2(ctx: Any) -> None:
        ctx.set_search_attributes({"first": 1})
        ctx.sleep(60)

    assert weft.turn(run_id) == TurnOutcome.FAILED
    error = weft.store.runs[run_id].error
    assert error is not None and error["type"].endswith(NonDeterminismError.__name__)
    assert weft.store.runs[run_id].search_attributes == {}


def test_a_deposed_owners_write_is_rejected_and_the_turn_stops(weft: Harness) -> None:
    def take_over(context: dict[str, Any]) -> None:
        # Another engine takes the run over just before this step commits (an expired lease).
        run = weft.store.runs[context["run_id"]]
        run.owner, run.epoch = "engine-2", run.epoch + 1

    @weft.workflow("attrs.deposed")
    def deposed(ctx: Any) -> None:
        ctx.set_search_attributes({"stage": "late"})

    faults.arm("before_step_commit", take_over, on_hit=1)
    run_id = weft.store.start("attrs.deposed")
    assert weft.turn(run_id) == TurnOutcome.DEPOSED
    run = weft.store.runs[run_id]
    assert run.search_attributes == {} and weft.history(run_id) == []
    assert (run.owner, run.status) == ("engine-2", RunStatus.RUNNING)


def test_continue_as_new_keeps_the_attributes_set_from_code(weft: Harness) -> None:
    @weft.workflow("attrs.chain")
    def chain(ctx: Any, n: int) -> int:
        if n == 0:
            ctx.set_search_attributes({"customer": 7})
            ctx.continue_as_new(1)
        return n

    run_id = weft.store.start("attrs.chain", 0)
    assert weft.turn(run_id) == TurnOutcome.CONTINUED
    successor = weft.store.runs[run_id].result["continued_as"]
    assert weft.store.runs[successor].search_attributes == {"customer": 7}
