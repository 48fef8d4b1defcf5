"""What must hold after a chaos run, read from the database alone.

Each invariant counts what it checked and lists what it found wrong; a run passes when
no invariant found anything. The checker trusts nothing the driver or the workers
remember: what was meant to happen is in the workload's own tables (the planned orders,
written before their starts), what happened is in django_weft's tables.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django_weft.engine.records import ACTIVE_STATUSES
from django_weft.models import Schedule, Signal, Step, WorkflowRun

from .models import LedgerRow, PlannedOrder, SlotMark
from .workflows import (
    CHILD,
    ENTER,
    LANE_LIMIT,
    LEAVE,
    LEDGER_AMOUNT,
    LIMITED,
    ORDER,
    SIGNAL,
    TICK,
    TICKED,
    expected_child_result,
    expected_limited_result,
    expected_order_result,
    lane_for,
    limited_id,
)

SCHEDULE_ID = "chaos-every-second"
SCHEDULE_EVERY = 1.0
LISTED = 5
"""Violations listed per invariant; the count says how many there were."""


@dataclass
class Invariant:
    name: str
    meaning: str
    checked: int = 0
    violations: list[str] = field(default_factory=list)
    applicable: bool = True
    found: str = ""
    """What else the check saw, for the summary (say, how close to its limit the run came)."""

    def fail(self, message: str) -> None:
        self.violations.append(message)

    @property
    def ok(self) -> bool:
        return not self.violations

    def line(self) -> str:
        if not self.applicable:
            return f"{self.name}: not applicable ({self.meaning})"
        if self.ok:
            return f"{self.name}: ok ({self.checked} checked{'; ' + self.found if self.found else ''})"
        shown = "; ".join(self.violations[:LISTED])
        more = f" (+{len(self.violations) - LISTED} more)" if len(self.violations) > LISTED else ""
        return f"{self.name}: {len(self.violations)} VIOLATION(S) in {self.checked} checked: {shown}{more}"


@dataclass
class Report:
    invariants: list[Invariant]
    figures: dict[str, int]

    @property
    def ok(self) -> bool:
        return all(invariant.ok for invariant in self.invariants)

    def by_name(self, name: str) -> Invariant:
        return next(invariant for invariant in self.invariants if invariant.name == name)

    def lines(self) -> list[str]:
        return [invariant.line() for invariant in self.invariants]

    def counts(self) -> str:
        """``name=checked`` for every invariant, ``!`` marking one that failed."""
        return " ".join(f"{i.name}={i.checked}{'' if i.ok else '!'}" for i in self.invariants if i.applicable)


def check_all(schedule_id: str = SCHEDULE_ID) -> Report:
    """Check every invariant against the database as it is now."""
    invariants = [
        runs_completed(),
        ledger_exactly_once(),
        no_step_recorded_twice(),
        no_write_after_deposition(),
        signals_once_in_order(),
        schedule_fires_once_without_gap(schedule_id),
        concurrency_limits_respected(),
    ]
    figures = {
        "orders": PlannedOrder.objects.count(),
        "runs": WorkflowRun.objects.count(),
        "steps": Step.objects.count(),
        "multi_epoch_runs": _runs_written_by_several_epochs(),
    }
    return Report(invariants, figures)


def runs_completed() -> Invariant:
    check = Invariant(
        "runs_completed",
        "every planned order has exactly one run, completed with the result its arguments "
        "determine; so has each order's child, its limited run and each schedule fire",
    )
    planned = dict(PlannedOrder.objects.values_list("key", "signals"))
    orders = defaultdict(list)
    for run in WorkflowRun.objects.filter(workflow_name=ORDER).values(
        "pk", "workflow_id", "status", "result"
    ):
        orders[run["workflow_id"]].append(run)
    for key, signals in planned.items():
        check.checked += 1
        runs = orders.get(key, [])
        if len(runs) != 1:
            check.fail(f"order {key}: {len(runs)} runs instead of 1")
            continue
        _completed_with(check, f"order {key}", runs[0], expected_order_result(key, signals))
    for key in sorted(set(orders) - set(planned)):
        check.fail(f"order {key}: a run nobody planned")
    children = Counter[str]()
    for run in WorkflowRun.objects.filter(workflow_name=CHILD).values(
        "pk", "workflow_id", "status", "result", "args", "parent__workflow_id"
    ):
        check.checked += 1
        key = run["args"][0] if run["args"] else "?"
        children[run["parent__workflow_id"] or ""] += 1
        _completed_with(check, f"child of {key}", run, expected_child_result(key))
    for key in planned:
        if children[key] != 1:
            check.fail(f"order {key}: {children[key]} child runs instead of 1")
    limited = defaultdict(list)
    for run in WorkflowRun.objects.filter(workflow_name=LIMITED).values(
        "pk", "workflow_id", "status", "result"
    ):
        limited[run["workflow_id"]].append(run)
    for key in planned:
        check.checked += 1
        runs = limited.pop(limited_id(key), [])
        if len(runs) != 1:
            check.fail(f"order {key}: {len(runs)} limited runs instead of 1")
            continue
        _completed_with(check, f"limited run of {key}", runs[0], expected_limited_result(key, lane_for(key)))
    for workflow_id in sorted(limited):
        check.fail(f"limited run {workflow_id}: a run nobody planned")
    for run in WorkflowRun.objects.filter(workflow_name=TICK).values("pk", "workflow_id", "status", "result"):
        check.checked += 1
        _completed_with(check, f"fire {run['workflow_id']}", run, TICKED)
    return check


def _completed_with(check: Invariant, what: str, run: dict[str, Any], expected: Any) -> None:
    if run["status"] != WorkflowRun.Status.COMPLETED:
        check.fail(f"{what}: {run['status']} (run {run['pk']})")
    elif run["result"] != expected:
        check.fail(f"{what}: result {run['result']!r}, expected {expected!r}")


def ledger_exactly_once() -> Invariant:
    check = Invariant(
        "ledger_exactly_once",
        "each order's atomic ledger step wrote its row exactly once, by its own run, and "
        "the step is recorded completed: the row and the record commit together or not at all",
    )
    rows = defaultdict(list)
    for key, run_id, amount in LedgerRow.objects.values_list("key", "run_id", "amount"):
        rows[key].append((str(run_id), amount))
    runs = dict(WorkflowRun.objects.filter(workflow_name=ORDER).values_list("workflow_id", "pk"))
    recorded = Counter(
        str(run_id)
        for run_id in Step.objects.filter(
            run__workflow_name=ORDER, name="chaos.ledger", status=Step.Status.COMPLETED
        ).values_list("run_id", flat=True)
    )
    for key in PlannedOrder.objects.values_list("key", flat=True):
        check.checked += 1
        written = rows.pop(key, [])
        run_id = str(runs.get(key, ""))
        if len(written) != 1:
            check.fail(f"order {key}: {len(written)} ledger rows instead of 1")
        elif written[0] != (run_id, LEDGER_AMOUNT):
            check.fail(f"order {key}: ledger row {written[0]} is not run {run_id}'s")
        if recorded[run_id] != 1:
            check.fail(f"order {key}: the ledger step is recorded completed {recorded[run_id]} times")
    for key, written in rows.items():
        check.fail(f"ledger key {key}: {len(written)} rows of no planned order")
    return check


def no_step_recorded_twice() -> Invariant:
    check = Invariant(
        "no_step_recorded_twice",
        "a run's history holds one step per position, and no activity call (name and "
        "arguments) at two positions: a replay found every recorded step instead of recording it again",
    )
    positions = Counter[tuple[str, int]]()
    calls = Counter[tuple[str, str, str]]()
    for run_id, seq, kind, name, args in Step.objects.values_list("run_id", "seq", "kind", "name", "args"):
        check.checked += 1
        positions[(str(run_id), seq)] += 1
        if kind == Step.Kind.ACTIVITY:
            calls[(str(run_id), name, json.dumps(args, sort_keys=True))] += 1
    for (run_id, seq), count in positions.items():
        if count > 1:
            check.fail(f"run {run_id}: position {seq} recorded {count} times")
    for (run_id, name, args), count in calls.items():
        if count > 1:
            check.fail(f"run {run_id}: {name}{args} recorded at {count} positions")
    return check


def no_write_after_deposition() -> Invariant:
    check = Invariant(
        "no_write_after_deposition",
        "every step was recorded by the owner epoch that held the run: in the order a run's "
        "steps were inserted their epochs never go back (a deposed owner that woke up wrote "
        "nothing), and no step names an epoch the run never reached",
    )
    epochs = dict(WorkflowRun.objects.values_list("pk", "owner_epoch"))
    reset = set(WorkflowRun.objects.filter(reset_from__isnull=False).values_list("pk", flat=True))
    latest: dict[Any, tuple[int, int]] = {}
    for run_id, seq, epoch in Step.objects.order_by("run_id", "id").values_list("run_id", "seq", "epoch"):
        check.checked += 1
        if epoch == 0 and run_id not in reset:
            check.fail(f"run {run_id}: step {seq} was written by no owner (epoch 0)")
        if epoch > epochs.get(run_id, 0):
            check.fail(
                f"run {run_id}: step {seq} names epoch {epoch}, the run only reached {epochs.get(run_id)}"
            )
        before = latest.get(run_id)
        if before is not None and epoch < before[0]:
            check.fail(
                f"run {run_id}: step {seq} was written by epoch {epoch} after step {before[1]} "
                f"of epoch {before[0]} (a write after a deposition)"
            )
        if before is None or epoch >= before[0]:
            latest[run_id] = (epoch, seq)
    return check


def _runs_written_by_several_epochs() -> int:
    """Runs whose steps were written by more than one owner epoch (resumed after a wait, or taken over)."""
    seen: dict[Any, set[int]] = defaultdict(set)
    for run_id, epoch in Step.objects.values_list("run_id", "epoch"):
        seen[run_id].add(epoch)
    return sum(1 for epochs in seen.values() if len(epochs) > 1)


def signals_once_in_order() -> Invariant:
    check = Invariant(
        "signals_once_in_order",
        "every numbered signal sent to an order is stored once and consumed once, in the order "
        "it was sent, and the workflow saw them in that order",
    )
    planned = dict(PlannedOrder.objects.values_list("key", "signals"))
    runs = dict(WorkflowRun.objects.filter(workflow_name=ORDER).values_list("pk", "workflow_id"))
    received = defaultdict(list)
    for run_id, payload, signal_id, consumed in (
        Signal.objects.filter(run__workflow_name=ORDER, name=SIGNAL)
        .order_by("run_id", "id")
        .values_list("run_id", "payload", "signal_id", "consumed_seq")
    ):
        check.checked += 1
        received[runs[run_id]].append((payload, signal_id, consumed))
    for key, count in planned.items():
        got = received.pop(key, [])
        payloads = [payload for payload, _, _ in got]
        if payloads != list(range(count)):
            check.fail(f"order {key}: signals stored as {payloads}, sent {list(range(count))}")
            continue
        consumed = [seq for _, _, seq in got]
        if None in consumed:
            check.fail(f"order {key}: signal {consumed.index(None)} was never consumed")
        elif consumed != sorted(consumed) or len(set(consumed)) != len(consumed):
            check.fail(f"order {key}: signals consumed at positions {consumed}, not in arrival order")
    for key, got in received.items():
        check.fail(f"{key}: {len(got)} signals to a run of no planned order")
    return check


def schedule_fires_once_without_gap(schedule_id: str) -> Invariant:
    check = Invariant(
        "schedule_fires_once",
        "the every-second schedule started one run per scheduled second, none twice and none "
        "skipped or missed between its first and its last fire",
    )
    schedule = Schedule.objects.filter(pk=schedule_id).first()
    if schedule is None:
        check.fail(f"schedule {schedule_id} does not exist")
        return check
    prefix = f"{schedule_id}-"
    moments = Counter[datetime]()
    for workflow_id in WorkflowRun.objects.filter(
        workflow_name=TICK, workflow_id__startswith=prefix
    ).values_list("workflow_id", flat=True):
        check.checked += 1
        moments[datetime.strptime(workflow_id[len(prefix) :], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)] += 1
    for moment, count in sorted(moments.items()):
        if count > 1:
            check.fail(f"the fire at {moment:%H:%M:%S} started {count} runs")
    if moments:
        first, last = min(moments), max(moments)
        step = timedelta(seconds=schedule.every_seconds or SCHEDULE_EVERY)
        expected = int((last - first) / step) + 1
        gaps = [first + i * step for i in range(expected) if first + i * step not in moments]
        if gaps:
            check.fail(f"{len(gaps)} scheduled second(s) without a run, the first at {gaps[0]:%H:%M:%S}")
    if schedule.fired_count != sum(moments.values()):
        check.fail(f"the schedule counts {schedule.fired_count} fires, {sum(moments.values())} runs exist")
    if schedule.skipped_count or schedule.missed_count:
        check.fail(f"the schedule skipped {schedule.skipped_count} and missed {schedule.missed_count} fires")
    return check


def concurrency_limits_respected() -> Invariant:
    """From the limited runs' entry and exit marks: how many held a slot of each lane at
    once. A run's span runs from its entry mark to its exit mark; a run that entered and
    has no exit mark held its slot until it finished (or holds it still), so its span
    runs to its ``finished_at`` (or without end). Every span lies within the time its run
    held a slot, so more than the limit at once anywhere is a breach of it."""
    check = Invariant(
        "concurrency_limit_respected",
        f"no lane of {LIMITED} ever had more than {LANE_LIMIT} runs holding a slot at once (the "
        "spans between each run's entry and exit marks, written on the database's clock by "
        "atomic steps, never overlap more), and each run marked its entry and its exit once",
    )
    marks: dict[str, dict[str, list[datetime]]] = defaultdict(lambda: defaultdict(list))
    lanes: dict[str, str] = {}
    for run_id, lane, edge, at in SlotMark.objects.values_list("run_id", "lane", "edge", "at"):
        marks[str(run_id)][edge].append(at)
        lanes[str(run_id)] = lane
    spans: dict[str, list[tuple[datetime, datetime, str]]] = defaultdict(list)
    created: dict[str, list[tuple[datetime, str]]] = defaultdict(list)
    for pk, status, finished_at, created_at, args in WorkflowRun.objects.filter(
        workflow_name=LIMITED
    ).values_list("pk", "status", "finished_at", "created_at", "args"):
        run_id = str(pk)
        check.checked += 1
        created[str(args[1]) if args and len(args) > 1 else "?"].append((created_at, run_id))
        got = marks.pop(run_id, {})
        enters, leaves = got.get(ENTER, []), got.get(LEAVE, [])
        if len(enters) > 1 or len(leaves) > 1:
            check.fail(f"run {run_id}: marked its entry {len(enters)} and its exit {len(leaves)} times")
        if status == WorkflowRun.Status.COMPLETED and (not enters or not leaves):
            check.fail(f"run {run_id}: completed without marking its entry and its exit")
        if not enters:
            continue
        if leaves:
            end = max(leaves)
        elif status in ACTIVE_STATUSES or finished_at is None:
            end = datetime.max.replace(tzinfo=UTC)
        else:
            end = finished_at
        spans[lanes[run_id]].append((min(enters), end, run_id))
    for run_id in sorted(marks):
        check.fail(f"run {run_id}: slot marks of no run of {LIMITED}")
    peak, waited = 0, 0
    for lane, lane_spans in sorted(spans.items()):
        peak = max(peak, _most_at_once(check, lane, lane_spans))
        waited += sum(
            1
            for at, _ in created[lane]
            if sum(1 for begin, end, _ in lane_spans if begin <= at < end) >= LANE_LIMIT
        )
    check.found = f"at most {peak} of {LANE_LIMIT} at once; {waited} runs started with their lane full"
    return check


def _most_at_once(check: Invariant, lane: str, spans: list[tuple[datetime, datetime, str]]) -> int:
    """The most spans open at one moment in ``lane``; each moment more than the limit are
    open is a violation naming its runs. A span ending when another begins does not
    overlap it."""
    events = sorted([(begin, 1, run) for begin, _, run in spans] + [(end, -1, run) for _, end, run in spans])
    open_runs: set[str] = set()
    most = 0
    for at, change, run in events:  # at one moment, exits (-1) sort before entries
        if change < 0:
            open_runs.discard(run)
            continue
        open_runs.add(run)
        most = max(most, len(open_runs))
        if len(open_runs) > LANE_LIMIT:
            check.fail(
                f"{lane}: {len(open_runs)} runs held a slot at {at:%H:%M:%S.%f} "
                f"(limit {LANE_LIMIT}): {', '.join(sorted(open_runs))}"
            )
    return most
