"""Flow control under real ``weft_worker`` processes (docs/explanation/flow-control.md):
no key ever has more runs holding a slot than its limit, also when a worker is SIGKILLed
holding some; priority orders a busy worker's queue; keys take turns under a workflow
limit; and a freed slot's next run is claimed without waiting for a tick.

On PostgreSQL with three worker processes of four threads each; on SQLite (one writer,
flow control held by one process) with one worker process of eight threads.
"""

from __future__ import annotations

import itertools
import random
import re
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

import pytest
from django.db import connection
from django.db.models import Count

from django_weft import client
from django_weft.engine.records import ACTIVE_STATUSES
from django_weft.models import Step, WorkflowRun
from tests.support.processes import WorkerProcess
from tests.testapp.flow_workflows import release_key
from tests.testapp.models import SideEffect

from .conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TWO_PER_KEY = "tests.flow.two_per_key"
FAIR = "tests.flow.fair_queue"
LIVE = sorted(ACTIVE_STATUSES)


def layout() -> tuple[int, int]:
    """(worker processes, threads each): three of four on PostgreSQL; on SQLite, whose
    limits hold within one process, one of eight (more threads than the six slots of
    ``tests.flow.two_per_key``, so runs queue there too)."""
    return (3, 4) if connection.vendor == "postgresql" else (1, 8)


def start_workers(start_worker: Callable[..., WorkerProcess], **options: object) -> list[WorkerProcess]:
    count, threads = layout()
    workers = [start_worker(threads=threads, **options) for _ in range(count)]
    for worker in workers:
        wait_for(lambda worker=worker: "started:" in worker.log, 60, "a worker to start")
    return workers


def release(name: str) -> None:
    SideEffect.objects.create(key=release_key(name))


def owned(run_id: str) -> bool:
    return WorkflowRun.objects.filter(pk=run_id, owner_id__isnull=False).exists()


def holds_slot(run_id: str) -> bool:
    """Whether run ``run_id`` holds its slot and a worker owns it (it is running)."""
    return WorkflowRun.objects.filter(pk=run_id, slot="held", owner_id__isnull=False).exists()


def queued(workflow: str) -> int:
    return WorkflowRun.objects.filter(workflow_name=workflow, slot="queued", status="pending").count()


def status(run_id: str) -> str:
    return str(WorkflowRun.objects.filter(pk=run_id).values_list("status", flat=True).first())


# -- what held a slot, and when ---------------------------------------------------------------


@dataclass
class HeldSampler:
    """Samples, from a thread of its own, how many live runs of ``workflow`` hold a slot
    per key and how many are queued, as often as the database answers."""

    workflow: str
    most_held: dict[str, int] = field(default_factory=dict)
    most_queued: int = 0
    samples: int = 0

    def sample(self) -> None:
        held = (
            WorkflowRun.objects.filter(workflow_name=self.workflow, slot="held", status__in=LIVE)
            .values_list("concurrency_key")
            .annotate(n=Count("pk"))
        )
        for key, n in held:
            self.most_held[key] = max(self.most_held.get(key, 0), n)
        queued = WorkflowRun.objects.filter(
            workflow_name=self.workflow, slot="queued", status="pending"
        ).count()
        self.most_queued = max(self.most_queued, queued)
        self.samples += 1

    @contextmanager
    def running(self) -> Iterator[HeldSampler]:
        stop = threading.Event()
        failure: list[BaseException] = []

        def loop() -> None:
            try:
                while not stop.is_set():
                    self.sample()
                    stop.wait(0.01)
            except BaseException as exc:  # reported by the test below
                failure.append(exc)
            finally:
                connection.close()

        thread = threading.Thread(target=loop, name="held-sampler", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join(10)
        if failure:
            raise failure[0]


def most_at_once(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one moment (an interval ending when another begins does
    not overlap it)."""
    events = sorted([(begin, 1) for begin, _ in intervals] + [(end, -1) for _, end in intervals])
    most = current = 0
    for _, change in events:  # at the same moment, -1 sorts before +1
        current += change
        most = max(most, current)
    return most


def marked_intervals() -> dict[str, list[tuple[datetime, datetime]]]:
    """Per key, the [begin, end] of each run of ``tests.flow.two_per_key``, from the rows its
    atomic ``mark`` activity wrote in the transactions that recorded those steps (so once
    per run, also across a takeover). Each interval lies within the time the run held its
    slot (from its first claim to its terminal commit)."""
    begins: dict[tuple[str, str], datetime] = {}
    ends: dict[tuple[str, str], datetime] = {}
    for key, at in SideEffect.objects.filter(key__regex=r"^(begin|end):").values_list("key", "created_at"):
        kind, customer, n = key.split(":")
        (begins if kind == "begin" else ends)[(customer, n)] = at
    assert begins.keys() == ends.keys(), "a run marked its begin without its end, or the other way round"
    by_key: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    for (customer, n), begin in begins.items():
        assert begin < ends[(customer, n)]
        by_key[customer].append((begin, ends[(customer, n)]))
    return by_key


def assert_limit_held(sampler: HeldSampler, runs: int, keys: int, limit: int) -> None:
    """No key ever had more than ``limit`` runs holding a slot, by the marked intervals
    and by the samples; and the limit was reached (the test would have seen a breach)."""
    marks = SideEffect.objects.filter(key__regex=r"^(begin|end):")
    assert marks.count() == 2 * runs, "each run marks its begin and its end exactly once"
    intervals = marked_intervals()
    assert sorted(intervals) == [f"k{i}" for i in range(keys)]
    at_once = {key: most_at_once(spans) for key, spans in intervals.items()}
    assert max(at_once.values()) == limit, at_once
    assert sampler.samples > 20, sampler.samples
    assert max(sampler.most_held.values()) == limit, sampler.most_held
    assert sampler.most_queued > 0, "no run was ever queued: the limit was never in the way"


def assert_nothing_held_or_queued(workflow: str) -> None:
    runs = WorkflowRun.objects.filter(workflow_name=workflow)
    assert not runs.filter(status__in=LIVE).exists(), list(
        runs.filter(status__in=LIVE).values("pk", "status")
    )
    assert not runs.filter(slot="queued").exclude(status="completed").exists()
    assert set(runs.values_list("status", "slot").distinct()) == {("completed", "held")}


def owners(workers: list[WorkerProcess]) -> dict[int, set[str]]:
    """Per worker pid, the live runs of ``tests.flow.two_per_key`` it owns now."""
    found: dict[int, set[str]] = {worker.pid: set() for worker in workers}
    for pk, owner in WorkflowRun.objects.filter(
        workflow_name=TWO_PER_KEY, status__in=LIVE, owner_id__isnull=False
    ).values_list("pk", "owner_id"):
        pid = int(owner.split(":")[1])
        if pid in found:
            found[pid].add(str(pk))
    return found


# -- 1. the limit across processes --------------------------------------------------------------


RUNS = 60
KEYS = 3


def start_two_per_key(seconds: float) -> list[client.WorkflowHandle]:
    return [
        client.start(TWO_PER_KEY, args=[f"k{i % KEYS}", i], kwargs={"seconds": seconds}) for i in range(RUNS)
    ]


def test_no_key_has_more_runs_holding_a_slot_than_its_limit(start_worker) -> None:  # type: ignore[no-untyped-def]
    workers = start_workers(start_worker)
    sampler = HeldSampler(TWO_PER_KEY)
    began = time.monotonic()
    with sampler.running():
        handles = start_two_per_key(0.2)
        results = [handle.result(timeout=60) for handle in handles]
    took = time.monotonic() - began
    assert results == list(range(RUNS))
    assert_limit_held(sampler, RUNS, KEYS, limit=2)
    assert_nothing_held_or_queued(TWO_PER_KEY)
    claimed = re.compile(rf"\({re.escape(TWO_PER_KEY)} [^)]*\): claimed")
    claimed_by = [worker for worker in workers if claimed.search(worker.log)]
    # On PostgreSQL the limit was decided across processes: at least two of them claimed
    # runs. (Which ones get work is the sweeps' race for it, SKIP LOCKED: one of three may
    # lose it all.) On SQLite the one worker process claimed them.
    assert len(claimed_by) >= min(2, len(workers)), "runs were not claimed by several worker processes"
    print(
        f"{RUNS} runs, {len(workers)} x {layout()[1]} threads: {took:.1f} s, {sampler.samples} samples, "
        f"most held {sampler.most_held}, most queued {sampler.most_queued}"
    )


def test_a_killed_workers_runs_keep_their_slots_and_are_taken_over(start_worker) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL a worker while it owns runs: they keep their slots until their lease expires
    and another worker takes them over (on SQLite, a replacement worker); the limit holds
    throughout, nothing is lost and nothing stays held or queued."""
    workers = start_workers(start_worker)
    sampler = HeldSampler(TWO_PER_KEY)
    with sampler.running():
        handles = start_two_per_key(0.5)
        victim_pid = wait_for(
            lambda: next((pid for pid, runs in owners(workers).items() if runs), None),
            30,
            "a worker to own a run",
        )
        victim = next(worker for worker in workers if worker.pid == victim_pid)
        victim.kill()
        killed_at = time.monotonic()
        orphaned = owners([victim])[victim.pid]  # nothing changes them now but a takeover
        assert orphaned, "the killed worker owned no run any more"
        if len(workers) == 1:
            start_worker(threads=layout()[1])
        results = [handle.result(timeout=60) for handle in handles]
    took_over = time.monotonic() - killed_at
    assert results == list(range(RUNS))
    assert_limit_held(sampler, RUNS, KEYS, limit=2)
    assert_nothing_held_or_queued(TWO_PER_KEY)
    epochs = dict(WorkflowRun.objects.filter(pk__in=orphaned).values_list("pk", "owner_epoch"))
    assert all(epoch >= 2 for epoch in epochs.values()), epochs  # taken over, not restarted
    print(
        f"killed a worker owning {len(orphaned)} runs; all {RUNS} done {took_over:.1f} s later, "
        f"most held {sampler.most_held}, most queued {sampler.most_queued}"
    )


# -- 2. priority on a busy worker -----------------------------------------------------------------


TURNS_BY_PRIORITY = {100: 3, 10: 2, 3: 1, 0: 2, -1: 3, -50: 1}
"""The turns of a run of each priority: a run's later turns (woken by its activities)
must keep its place too, not only its first."""


def test_queued_starts_complete_in_priority_order_first_come_first_served_within_one(start_worker) -> None:  # type: ignore[no-untyped-def]
    """One worker thread, busy with a run; 50 starts with mixed priorities meanwhile, of a
    workflow whose queued activities wake it for further turns: they complete higher
    priority first, ties in the order they were started."""
    worker = start_worker(threads=1)
    blocker = client.start("tests.flow.busy", args=["priority"])
    wait_for(lambda: owned(blocker.run_id), 30, "the worker's one thread to take the blocking run")
    chooser = random.Random(20261205)
    priorities = [chooser.choice(sorted(TURNS_BY_PRIORITY)) for _ in range(50)]
    handles = [
        client.start(
            "tests.flow.ranked", args=[f"r{i:02d}"], kwargs={"steps": TURNS_BY_PRIORITY[p] - 1}, priority=p
        )
        for i, p in enumerate(priorities)
    ]
    ids = [handle.run_id for handle in handles]
    # Every start has been sent to the worker's queue, and the sweep's ring has rung.
    unsent = WorkflowRun.objects.filter(pk__in=ids, dispatched_at__isnull=True)
    wait_for(lambda: not unsent.exists(), 30, "the sweep to send every start to the worker")
    time.sleep(0.5)
    # All waiting, none begun: on PostgreSQL the sweep claimed them for the worker's
    # thread (in priority order), on SQLite it only sent them.
    assert WorkflowRun.objects.filter(pk__in=ids, status="running").count() == 50
    assert not Step.objects.filter(run_id__in=ids).exists()
    release("priority")
    for handle in handles:
        handle.result(timeout=60)
    assert blocker.result(timeout=10) is True
    marks = SideEffect.objects.filter(key__startswith="done:").order_by("pk").values_list("key", flat=True)
    done = [key.removeprefix("done:") for key in marks]
    expected = [f"r{i:02d}" for i in sorted(range(50), key=lambda i: (-priorities[i], i))]
    assert done == expected, [(label, priorities[int(label[1:])]) for label in done]
    assert "crashed" not in worker.log


# -- 3. keys take turns -------------------------------------------------------------------------------


def test_a_key_with_few_runs_is_not_starved_by_one_with_many(start_worker) -> None:  # type: ignore[no-untyped-def]
    """``Concurrency(limit=1, key=..., scope="workflow")``: key A has 100 queued runs, key B
    3; B's three are among the first 8 to finish."""
    start_workers(start_worker)
    holder = client.start(FAIR, args=["H"], kwargs={"release": "fair"})
    wait_for(lambda: holds_slot(holder.run_id), 30, "the holder to take the slot")
    many = [client.start(FAIR, args=["A"], kwargs={"n": n}) for n in range(100)]
    few = [client.start(FAIR, args=["B"], kwargs={"n": n}) for n in range(3)]
    wait_for(lambda: queued(FAIR) == 103, 60, "every start to be queued for the slot")
    release("fair")
    for handle in [holder, *many, *few]:
        handle.result(timeout=60)
    runs = WorkflowRun.objects.filter(workflow_name=FAIR).exclude(pk=holder.run_id)
    finished = list(runs.order_by("finished_at").values_list("concurrency_key", flat=True))
    places = [place for place, key in enumerate(finished, 1) if key == "B"]
    print(f"key B's runs finished {', '.join(map(str, places))} of {len(finished)}")
    assert len(places) == 3 and max(places) <= 8, finished[:12]
    assert_nothing_held_or_queued(FAIR)


# -- 4. how soon a freed slot's next run is claimed -------------------------------------------------


SLOW_TICK = 1.0
"""The workers' tick in the hand-on tests: long enough that a claim waiting for a tick shows."""


def hand_on_gaps(run_ids: list[str]) -> list[float]:
    """Seconds from each run's terminal commit to the next run's claim, in claim order (one
    run at a time holds the slot, each in a single turn, so ``claimed_at`` is its only claim)."""
    rows = sorted(
        WorkflowRun.objects.filter(pk__in=run_ids).values_list("claimed_at", "finished_at"),
        key=lambda row: row[0],
    )
    return [(claimed - finished).total_seconds() for (_, finished), (claimed, _) in itertools.pairwise(rows)]


def test_a_freed_slot_is_claimed_by_the_next_run_without_waiting_for_a_tick(start_worker) -> None:  # type: ignore[no-untyped-def]
    """A saturated limit (one slot, 40 runs queued): a run's ending hands its slot on and
    rings the next run's doorbell in the same process, so the next claim follows within a
    fraction of the tick (the sweep would take up to a whole one)."""
    start_workers(start_worker, tick=SLOW_TICK)
    holder = client.start(FAIR, args=["H"], kwargs={"release": "gap"})
    wait_for(lambda: holds_slot(holder.run_id), 30, "the holder to take the slot")
    waiting = [client.start(FAIR, args=[f"g{n % 4}"], kwargs={"n": n}) for n in range(40)]
    wait_for(lambda: queued(FAIR) == 40, 60, "every start to be queued for the slot")
    release("gap")
    for handle in [holder, *waiting]:
        handle.result(timeout=60)
    gaps = hand_on_gaps([holder.run_id] + [handle.run_id for handle in waiting])
    assert len(gaps) == 40 and min(gaps) > 0
    median, worst = statistics.median(gaps), max(gaps)
    p90 = sorted(gaps)[int(len(gaps) * 0.9)]
    print(
        f"hand-on gap over {len(gaps)} slots ({connection.vendor}, {layout()[0]} x {layout()[1]} threads): "
        f"median {median * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms, max {worst * 1000:.1f} ms "
        f"(tick {SLOW_TICK:g} s)"
    )
    assert median < SLOW_TICK / 20, gaps
    assert worst < SLOW_TICK, gaps


def test_a_slot_freed_from_outside_is_handed_on_within_a_tick(start_worker) -> None:  # type: ignore[no-untyped-def]
    """A run cancelled from the API frees its slot with no worker involved: the sweep lets
    the next run in and sends it, so it is claimed within one tick of the cancel."""
    start_workers(start_worker, tick=SLOW_TICK)
    holder = client.start("tests.flow.one", args=["holder"])
    wait_for(lambda: status(holder.run_id) == "waiting", 30, "the holder to wait, holding the slot")
    gaps = []
    current = holder
    for i in range(3):
        following = client.start("tests.flow.one", args=[f"next-{i}"])
        wait_for(lambda: queued("tests.flow.one") == 1, 30, "the next run to be queued")
        current.cancel("next, please")
        following_id = following.run_id
        wait_for(lambda: status(following_id) == "waiting", 30, "the next run to take the slot")  # noqa: B023
        gaps += hand_on_gaps([current.run_id, following.run_id])
        current = following
    current.cancel("done")
    shown = ", ".join(f"{gap * 1000:.0f} ms" for gap in gaps)
    print(f"slot freed by a cancel: next claim after {shown} (tick {SLOW_TICK:g} s)")
    assert all(0 < gap < SLOW_TICK + 0.5 for gap in gaps), gaps
