"""Activity flow control across real ``weft_worker`` processes: a rate limit shared by
three workers paces their attempts, and an activity concurrency limit holds across them.
Each attempt records when it began (and ended) in a table, in its worker process."""

from __future__ import annotations

from datetime import datetime

import pytest

from django_weft import client
from django_weft.engine.flow import RATE_LIMIT_BURST
from django_weft.models import WorkflowRun
from tests.testapp.models import SideEffect

from .conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def finished(workflow: str) -> int:
    return WorkflowRun.objects.filter(workflow_name=workflow, status="completed").count()


def window_peak(moments: list[datetime], seconds: float) -> int:
    """The most moments any window ``[t, t + seconds)`` holds."""
    ordered = sorted(moments)
    peak, first = 0, 0
    for last, moment in enumerate(ordered):
        while (moment - ordered[first]).total_seconds() >= seconds:
            first += 1
        peak = max(peak, last - first + 1)
    return peak


def test_a_rate_limit_shared_by_three_workers_paces_all_their_attempts(start_worker) -> None:  # type: ignore[no-untyped-def]
    # tests.twenty: 20 per second; 120 runs of one inline activity each, started at once.
    workers = [start_worker(threads=4) for _ in range(3)]
    for worker in workers:  # all three take part from the first start
        wait_for(lambda worker=worker: "started:" in worker.log, 60, "a worker to start")
    handles = [client.start("tests.af.twenty_per_second", args=[f"r{i}"]) for i in range(120)]
    wait_for(lambda: finished("tests.af.twenty_per_second") == 120, 60, "the 120 runs to complete")
    attempts = list(SideEffect.objects.filter(key__startswith="twenty:").values_list("key", "created_at"))
    assert len(attempts) == 120  # each attempt ran once
    began = [created_at for _, created_at in attempts]
    span = (max(began) - min(began)).total_seconds()
    peak = window_peak(began, 1.0)
    print(f"120 attempts at 20/s on 3 workers: {span:.2f} s from the first to the last, at most {peak} "
          "in a second")  # fmt: skip
    assert span >= 5.5, span
    assert peak <= 20 + RATE_LIMIT_BURST, peak
    # Attempts ran in several processes: the pace above was kept by processes sharing the
    # limit, and attempts over it were parked until their moment. (Which workers take the
    # runs is the sweeps' and notices' business: on SQLite, without notices, two sweeps may
    # take all 120 between them, and a worker wakes the runs it parked itself.)
    ran_in = {key.rsplit(":", 1)[1] for key, _ in attempts}
    print(
        "attempts per worker:",
        {pid: sum(1 for key, _ in attempts if key.endswith(":" + pid)) for pid in ran_in},
    )
    assert len(ran_in) >= 2 and ran_in <= {str(w.pid) for w in workers}, (ran_in, [w.pid for w in workers])
    assert any("parked, waiting on rate_limit" in w.log for w in workers)
    assert all(handle.result(timeout=1) is None for handle in handles[:5])


def test_activity_concurrency_holds_across_three_workers(start_worker) -> None:  # type: ignore[no-untyped-def]
    # tests.af.two_at_once: two attempts at once; 24 runs of one 0.2 s attempt each.
    for _ in range(3):
        start_worker(threads=4)
    for i in range(24):
        client.start("tests.af.at_most_two", args=[f"c{i}"], kwargs={"seconds": 0.2})
    wait_for(lambda: finished("tests.af.at_most_two") == 24, 60, "the 24 runs to complete")
    events = sorted(
        (created_at, 1 if key.startswith("begin:") else -1)
        for key, created_at in SideEffect.objects.filter(key__regex=r"^(begin|end):c\d+$").values_list(
            "key", "created_at"
        )
    )
    assert len(events) == 48
    executing, peak = 0, 0
    for _, change in events:
        executing += change
        peak = max(peak, executing)
    print(f"activity concurrency 2 on 3 workers: at most {peak} attempts executing at once")
    assert peak == 2, peak  # never more than two, and the limit was reached
    # 24 attempts of 0.2 s two at a time: at least 2.4 s from the first begin to the last end.
    assert (events[-1][0] - events[0][0]).total_seconds() >= 2.3
