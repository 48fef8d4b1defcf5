"""Flow control of activities without a database: the rate forms of ``WEFT_RATE_LIMITS``,
``RateLimit`` and activity ``Concurrency`` declarations, the GCRA arithmetic, what a held
attempt says, and the engine's path on the in-memory store (an inline attempt held by
its rate limit parks and resumes; retries and replay are unaffected)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from django_weft import Concurrency, ConfigurationError, InvalidInput, RateLimit, RetryPolicy
from django_weft.engine.attempt import AttemptFlow, admit_attempt
from django_weft.engine.executor import EngineConfig
from django_weft.engine.flow import (
    RATE_LIMIT_BURST,
    START_GRACE_MIN,
    Hold,
    HoldKind,
    Rate,
    activity_flow_keys,
    from_micros,
    gcra_moment,
    gcra_take,
    parse_rate,
    parse_rate_limits,
    reservation_stands,
    start_grace,
    to_micros,
)
from django_weft.engine.records import ClaimedRun
from django_weft.engine.registry import Activity, Registry, Workflow, activity, registry
from django_weft.engine.replay import ReplayResult, replay_history
from django_weft.engine.testing.memory_store import memory_engine

# -- the rate forms ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "limit", "per"),
    [
        ("50/s", 50, 1.0),
        ("600/m", 600, 60.0),
        ("10/5s", 10, 5.0),
        ("1000/1h30m", 1000, 5400.0),
        ("2/500ms", 2, 0.5),
        (" 3 / 1.5h ", 3, 5400.0),
        ("7/second", 7, 1.0),
        ("1/d", 1, 86400.0),
    ],
)
def test_the_documented_rate_forms_are_read(text: str, limit: int, per: float) -> None:
    assert parse_rate(text, what="rate") == Rate(limit, per)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("50", r"is '50'; write '<limit>/<period>', for example '50/s', '600/m' or '10/5s'"),
        ("50/", r"is '50/'; write '<limit>/<period>'"),
        ("/s", r"is '/s'; write"),
        ("fifty/s", r"is 'fifty/s'; write"),
        ("1.5/s", r"is '1.5/s'; write"),
        ("-1/s", r"is '-1/s'; write"),
        ("50/s/2", r"is '50/s/2'; write"),
        ("0/s", r"limit must be a whole number of at least 1; got 0"),
        ("50/0s", r"per must be a positive duration"),
        ("50/fortnight", r"unknown unit 'fortnight'"),
        (50, r"must be a string; write '<limit>/<period>'"),
        (None, r"must be a string"),
        ((50, 1), r"must be a string"),
    ],
)
def test_other_rate_forms_are_refused_saying_what_to_write(value: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_rate(value, what="WEFT_RATE_LIMITS['stripe']")


def test_the_setting_is_a_dict_of_names_to_rates() -> None:
    assert parse_rate_limits({"stripe": "50/s", "mail": "600/m"}) == {
        "stripe": Rate(50, 1.0),
        "mail": Rate(600, 60.0),
    }
    assert parse_rate_limits(None) == {}
    with pytest.raises(ConfigurationError, match=r"must be a dict from rate limit names to rates"):
        parse_rate_limits(["stripe", "50/s"])
    with pytest.raises(ConfigurationError, match=r"has the key 3; a key is the name of a RateLimit"):
        parse_rate_limits({3: "50/s"})
    with pytest.raises(ConfigurationError, match=r"WEFT_RATE_LIMITS\['stripe'\] is '50 per second'"):
        parse_rate_limits({"stripe": "50 per second"})


# -- declarations --------------------------------------------------------------------------


def test_a_rate_limit_checks_what_it_is_given() -> None:
    limit = RateLimit("stripe", limit=100, per="1s")
    assert (limit.per, limit.rate({})) == (1.0, Rate(100, 1.0))
    assert limit.rate({"stripe": Rate(50, 1.0), "other": Rate(1, 1.0)}) == Rate(50, 1.0)
    for kwargs, message in [
        ({"name": "", "limit": 1, "per": 1}, "must be a non-empty string"),
        ({"name": "a\x00b", "limit": 1, "per": 1}, "without control characters"),
        ({"name": "n" * 101, "limit": 1, "per": 1}, "at most 100 characters"),
        ({"name": "x", "limit": 0, "per": 1}, "limit must be a whole number of at least 1; got 0"),
        ({"name": "x", "limit": True, "per": 1}, "limit must be a whole number"),
        ({"name": "x", "limit": 2.5, "per": 1}, "limit must be a whole number"),
        ({"name": "x", "limit": 1, "per": "0s"}, "per must be a positive duration"),
        ({"name": "x", "limit": 1, "per": "soon"}, "per 'soon' is not a duration"),
        (
            {"name": "x", "limit": 1, "per": 1, "key": "account"},
            "takes a function of the activity's arguments",
        ),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            RateLimit(**kwargs)


def test_activity_concurrency_takes_queue_and_per_key_only() -> None:
    def body() -> None: ...

    with pytest.raises(
        ConfigurationError, match=r"on_limit must be 'queue' \(the default\); got on_limit='skip'"
    ):
        activity(body, name="tests.engine.af.skip", concurrency=Concurrency(limit=1, on_limit="skip"))
    with pytest.raises(ConfigurationError, match=r"scope='workflow' .* does not apply to activity attempts"):
        activity(body, name="tests.engine.af.scope", concurrency=Concurrency(limit=1, scope="workflow"))
    with pytest.raises(ConfigurationError, match=r"takes django_weft.RateLimit\(...\); got 'stripe'"):
        activity(body, name="tests.engine.af.name", rate_limit="stripe")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"takes django_weft.Concurrency\(...\); got 8"):
        activity(body, name="tests.engine.af.int", concurrency=8)  # type: ignore[arg-type]
    assert "tests.engine.af.skip" not in registry.activities
    declared = activity(body, name="tests.engine.af.ok", concurrency=Concurrency(limit=8, key=None))
    try:
        assert declared.flow_controlled and declared.concurrency.limit == 8
        assert registry.activity_concurrency_limits()["tests.engine.af.ok"].limit == 8
    finally:
        registry.unregister("tests.engine.af.ok")


def test_keys_come_from_the_activity_arguments_and_a_bad_one_says_why() -> None:
    limit = RateLimit("stripe", 1, 1, key=lambda account, **_: f"acct-{account}")
    slots = Concurrency(limit=2, key=lambda account, amount: amount)
    assert activity_flow_keys("charge", limit, slots, [7], {"amount": 3}) == ("acct-7", "3")
    assert activity_flow_keys("charge", None, Concurrency(limit=1), [7], {}) == ("", "")
    computed = (
        r"rate limit key of activity 'charge' could not be computed from the activity's arguments: TypeError"
    )
    with pytest.raises(InvalidInput, match=computed):
        activity_flow_keys("charge", limit, None, [], {})
    with pytest.raises(
        InvalidInput, match=r"concurrency key of activity 'charge' for these arguments is empty"
    ):
        activity_flow_keys("charge", None, Concurrency(limit=1, key=lambda x: ""), ["a"], {})
    with pytest.raises(InvalidInput, match=r"concurrency key function of activity 'charge' must return"):
        activity_flow_keys("charge", None, Concurrency(limit=1, key=lambda x: [x]), ["a"], {})


# -- the arithmetic ------------------------------------------------------------------------


def test_the_interval_is_rounded_up_so_rounding_never_exceeds_the_limit() -> None:
    assert Rate(3, 1.0).interval_us == 333_334
    assert Rate(20, 1.0).interval_us == 50_000
    assert Rate(600, 60.0).interval_us == 100_000
    assert RATE_LIMIT_BURST == 1
    moments = _moments_of_a_burst(Rate(3, 1.0), 4, now=0)
    assert [m for m in moments if m < 1_000_000] == [0, 333_334, 666_668]


def _moments_of_a_burst(rate: Rate, count: int, now: int) -> list[int]:
    tat: int | None = None
    moments = []
    for _ in range(count):
        tat, moment = gcra_take(tat, now, rate)
        moments.append(moment)
    return moments


def test_a_burst_is_paced_one_interval_apart_in_arrival_order() -> None:
    rate = Rate(20, 1.0)
    assert _moments_of_a_burst(rate, 5, now=1_000) == [1_000, 51_000, 101_000, 151_000, 201_000]
    # After a quiet period the bucket starts afresh: the next attempt goes at once.
    tat, moment = gcra_take(201_000 + 50_000, 5_000_000, rate)
    assert (tat, moment) == (5_050_000, 5_000_000)
    # The store reads the statement's result with the same arithmetic.
    assert gcra_moment(251_000, rate) == 201_000
    assert gcra_moment(5_050_000, rate) == 5_000_000


@pytest.mark.parametrize("seed", range(5))
def test_no_window_of_per_holds_more_than_limit_moments_whatever_the_arrivals(seed: int) -> None:
    generator = random.Random(seed)
    rate = Rate(generator.randint(1, 30), generator.choice([0.5, 1.0, 2.0]))
    per_us = round(rate.per * 1_000_000)
    now, tat = 0, None
    moments = []
    for _ in range(400):
        now += generator.choice([0, 0, 0, 1_000, 20_000, 300_000, 2_000_000])
        tat, moment = gcra_take(tat, now, rate)
        assert moment >= now  # never before its arrival
        moments.append(moment)
    moments.sort()
    for index, start in enumerate(moments):
        inside = [m for m in moments[index:] if m < start + per_us]
        assert len(inside) <= rate.limit, (rate, start, len(inside))


def test_an_attempt_starts_on_its_moment_only_within_half_an_interval_after_it() -> None:
    moment = datetime(2030, 1, 1, tzinfo=UTC)
    slow, fast = Rate(20, 1.0), Rate(1000, 1.0)  # intervals of 50 ms and 1 ms
    assert (start_grace(slow), start_grace(fast)) == (0.025, START_GRACE_MIN)
    assert reservation_stands(moment, moment + timedelta(milliseconds=25), slow)
    assert not reservation_stands(moment, moment + timedelta(milliseconds=26), slow)
    assert reservation_stands(moment, moment + timedelta(milliseconds=20), fast)  # a wake-up takes a few ms
    assert not reservation_stands(moment, moment + timedelta(milliseconds=21), fast)
    assert not reservation_stands(None, moment, slow)


@pytest.mark.parametrize("seed", range(3))
def test_starts_within_the_grace_of_their_moments_keep_to_the_limit_plus_one(seed: int) -> None:
    generator = random.Random(seed)
    rate = Rate(20, 1.0)
    moments = _moments_of_a_burst(rate, 300, now=0)
    grace_us = round(start_grace(rate) * 1_000_000)
    starts = [moment + generator.randint(0, grace_us) for moment in moments]
    starts.sort()
    peak = max(len([s for s in starts[i:] if s < start + 1_000_000]) for i, start in enumerate(starts))
    assert peak <= rate.limit + RATE_LIMIT_BURST


def test_times_round_trip_through_microseconds() -> None:
    moment = datetime(2030, 5, 6, 7, 8, 9, 123_456, tzinfo=UTC)
    assert from_micros(to_micros(moment)) == moment


# -- what a held attempt says ---------------------------------------------------------------


def test_a_hold_says_what_it_waits_for() -> None:
    until = datetime(2030, 1, 1, 14, 5, 1, 250_999, tzinfo=UTC)
    rate = Hold(HoldKind.RATE_LIMIT, "charge", until, name="stripe", reserved=until)
    assert rate.text == "delayed by rate limit stripe until 14:05:01.250"
    assert Hold(HoldKind.RATE_LIMIT, "charge", until, key="acct-1", name="stripe").text == (
        "delayed by rate limit stripe key acct-1 until 14:05:01.250"
    )
    slots = Hold(HoldKind.CONCURRENCY, "charge", until, key="acct-1", limit=8, in_use=8)
    assert slots.text == "queued: activity concurrency charge key acct-1 (8 of 8 in use)"
    assert Hold.of(rate.as_result(), "charge") == rate
    assert Hold.of(slots.as_result(), "charge") == slots
    assert rate.waiting_on(3)["kind"] == "rate_limit" and rate.waiting_on(3)["fire_at"] == until.isoformat()


# -- the engine on the in-memory store ---------------------------------------------------------


def _engine(activity_: Activity[..., Any], retry: RetryPolicy | None = None) -> Any:
    workflows = Registry()

    def body(ctx: Any, label: str) -> Any:
        return ctx.run(activity_, label)

    workflows.workflows["flow"] = Workflow(fn=body, name="flow")
    config = EngineConfig(default_retry=retry or RetryPolicy(max_attempts=1), inline_retry_max_delay=1.0)
    engine, store, dispatcher = memory_engine(workflows, config)
    return engine, store, dispatcher, workflows


def _replay(store: Any, run_id: str, workflows: Registry) -> ReplayResult:
    run = store.runs[run_id]
    steps = {step.seq: step for step in store.history(run_id)}
    claimed = ClaimedRun(
        run_id,
        run.workflow_id,
        run.workflow_name,
        run.args,
        run.kwargs,
        1,
        1,
        run.created_at,
        store.now,
        steps,
    )
    return replay_history(claimed, workflows=workflows)


def test_an_inline_attempt_over_the_rate_limit_parks_the_run_until_its_moment() -> None:
    calls: list[str] = []
    act = Activity(fn=calls.append, name="record", rate_limit=RateLimit("mem", limit=2, per="1s"))
    engine, store, dispatcher, workflows = _engine(act)
    first, second = store.start("flow", "a"), store.start("flow", "b")
    assert engine.run_turn(first) == "completed"
    assert engine.run_turn(second) == "parked"
    (held,) = store.history(second)
    assert (held.status, held.attempt, held.result["kind"]) == ("delayed", 1, "rate_limit")
    assert held.result["reserved"] == held.result["until"]  # the moment it was given
    until = datetime.fromisoformat(held.result["until"])
    assert timedelta(seconds=0.45) < until - store.now <= timedelta(seconds=0.5)
    waiting_on = store.runs[second].waiting_on
    assert waiting_on is not None and waiting_on["text"].startswith("delayed by rate limit mem until ")
    assert dispatcher.turns[-1] == (second, until)  # its doorbell, for then
    assert engine.run_turn(second) == "not_claimed" and calls == ["a"]
    # The held history replays (to its end: the hold) without writing anything.
    assert (_replay(store, second, workflows).verdict, _replay(store, second, workflows).end) == (
        "ok", "end_of_history"
    )  # fmt: skip
    store.advance(0.5)
    assert engine.run_turn(second) == "completed"
    assert calls == ["a", "b"]  # once: the moment it took is its own, no second one is taken
    assert store.buckets[("mem", "")] == to_micros(until) + Rate(2, 1.0).interval_us
    (done,) = store.history(second)
    assert (done.status, done.attempt, done.result, done.failed_attempts) == ("completed", 1, None, ())
    # The finished history is the one a run never held records, and replays to its end.
    assert [(s.seq, s.kind, s.name, s.status, s.attempt) for s in store.history(first)] == [
        (s.seq, s.kind, s.name, s.status, s.attempt) for s in store.history(second)
    ]
    assert (_replay(store, second, workflows).verdict, _replay(store, second, workflows).end) == (
        "ok",
        "returned",
    )


def test_a_delay_does_not_use_up_an_attempt_and_each_attempt_takes_a_moment() -> None:
    failures = iter([RuntimeError("first"), RuntimeError("second")])

    def flaky(label: str) -> str:
        error = next(failures, None)
        if error is not None:
            raise error
        return label

    act = Activity(fn=flaky, name="flaky", rate_limit=RateLimit("mem2", limit=1, per="1s"))
    engine, store, _, _ = _engine(act, RetryPolicy(max_attempts=3, initial_interval=0.001, backoff=1.0))
    run = store.start("flow", "x")
    assert engine.run_turn(run) == "parked"  # attempt 1 went and failed; attempt 2 waits for its moment
    (step,) = store.history(run)
    assert (step.status, step.attempt, len(step.failed_attempts)) == ("delayed", 2, 1)
    store.advance(1.0)
    assert engine.run_turn(run) == "parked"  # attempt 2 failed; attempt 3 waits in turn
    (step,) = store.history(run)
    assert (step.status, step.attempt, len(step.failed_attempts)) == ("delayed", 3, 2)
    store.advance(1.0)
    assert engine.run_turn(run) == "completed"  # three attempts, as the policy allows: none used by delays
    (step,) = store.history(run)
    assert (step.status, step.attempt, step.result) == ("completed", 3, "x")
    assert [failed["error"]["message"] for failed in step.failed_attempts] == ["first", "second"]


def test_a_slot_taken_before_the_rate_limit_failed_is_given_back() -> None:
    act = Activity(
        fn=str, name="both", rate_limit=RateLimit("both", limit=2, per="1s"), concurrency=Concurrency(limit=1)
    )
    _, store, _, _ = _engine(act)
    run = store.start("flow", "a")
    flow = AttemptFlow.of(act, ["a"], {}, {})
    assert flow is not None

    def broken(*args: Any) -> None:
        raise ConnectionError("the database went away")

    store.take_rate_limit = broken  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        admit_attempt(store, act, flow, run, 0, ttl=30, reserved=None, now=lambda: store.now, holder="h")
    # No slot is left held by an execution that never ran: the next one takes it at once.
    assert store.slots[("both", "")] == ({}, [])
