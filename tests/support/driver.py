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
