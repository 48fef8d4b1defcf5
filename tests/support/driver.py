"""Helpers shared by the in-process tests."""

from __future__ import annotations

import threading
import time
from collections import Counter

from django.db import connection

from django_weft.engine.executor import TurnOutcome
from django_weft.models import WorkflowRun
from django_weft.runtime import tick
from django_weft.runtime.dispatch import SweepOnlyDispatcher
from django_weft.testing import make_engine


class Driver:
    """A worker in a thread: fires due timers and runs turns of runnable runs."""

    def __init__(self, name: str = "driver") -> None:
        self._name = name
        self._stop = threading.Event()
        self.errors: list[BaseException] = []
        self.outcomes: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._loop, name="driver", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        engine = make_engine(self._name)
        sweep = SweepOnlyDispatcher()
        try:
            while not self._stop.is_set():
                tick(sweep)
                for run_id in list(WorkflowRun.objects.runnable().values_list("pk", flat=True)):
                    self.outcomes[engine.run_turn(str(run_id))] += 1
                time.sleep(0.002)
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            connection.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self.errors, self.errors


def park(run_id: str) -> None:
    assert make_engine().run_turn(run_id) == TurnOutcome.PARKED
    assert WorkflowRun.objects.get(pk=run_id).status == "waiting"


def depose_by_takeover(run_id: str, stale_id: str, fresh_id: str) -> tuple[TurnOutcome, TurnOutcome]:
    """Two engines on run ``run_id`` (a ``tests.fence_probe`` run): ``stale_id``'s stalls
    after its activity at position 1, ``fresh_id``'s takes the run over once that lease
    runs out and completes it, then the stale one goes on and its write is refused.
    Returns both turns' outcomes, the stale engine's first (``DEPOSED``)."""
    from typing import Any

    from django_weft.engine import faults

    stale, fresh = make_engine(stale_id), make_engine(fresh_id)
    stalled, fresh_done = threading.Event(), threading.Event()

    def stall(context: dict[str, Any]) -> None:
        if context["engine"] is stale and context["seq"] == 1:
            stalled.set()
            fresh_done.wait(30)

    faults.arm("after_activity", stall)
    outcomes: dict[str, TurnOutcome] = {}

    def run_stale() -> None:
        try:
            outcomes["stale"] = stale.run_turn(run_id)
        finally:
            connection.close()

    thread = threading.Thread(target=run_stale)
    thread.start()
    try:
        assert stalled.wait(10)
        deadline = time.monotonic() + 15
        outcome = TurnOutcome.NOT_CLAIMED
        while outcome == TurnOutcome.NOT_CLAIMED and time.monotonic() < deadline:
            time.sleep(0.2)
            outcome = fresh.run_turn(run_id)
    finally:
        fresh_done.set()
        thread.join(10)
        faults.disarm("after_activity")
    return outcomes["stale"], outcome
