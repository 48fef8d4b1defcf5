"""The in-memory store's flow control of activity attempts: rate limits (the same GCRA
arithmetic as the database's) and concurrency slots with their queue, without leases
(nothing crashes in memory). A part of :class:`~.memory_store.MemoryStore`."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime

from .. import codec
from ..flow import Rate, SlotTaken, from_micros, gcra_take, to_micros
from ..records import RunStatus, StepStatus, TimerKind, TimerWrite
from .memory_rows import MemoryRun


class MemoryFlowControl:
    """Rate limit buckets and concurrency slots, kept by the store that inherits this."""

    now: datetime
    runs: dict[str, MemoryRun]
    _lock: threading.RLock
    buckets: dict[tuple[str, str], int]
    """Each rate limit's theoretical arrival time (µs), by (name, key)."""
    slots: dict[tuple[str, str], tuple[dict[tuple[str, int], str], list[tuple[str, int]]]]
    """Activity concurrency slots by (activity, key): the attempt positions holding one
    (with the execution holding it, empty when handed on and not yet taken up), and the
    queue."""

    def hand_on_slot(self, run_id: str, workflow_name: str) -> list[tuple[str, int]]:
        """Nothing to hand on: this store keeps no concurrency slots (flow control is
        decided in the database; tests of it run on the Django store)."""
        return []

    def take_rate_limit(self, name: str, key: str, rate: Rate) -> datetime | None:
        with self._lock:
            now = to_micros(self.now)
            self.buckets[(name, key)], moment = gcra_take(self.buckets.get((name, key)), now, rate)
            return None if moment <= now else from_micros(moment)

    def take_activity_slot(
        self, activity: str, key: str, limit: int, run_id: str, seq: int, ttl: float, holder: str
    ) -> SlotTaken:
        """The Django store's rule without leases (nothing crashes here): a slot handed on,
        or a free one when no attempt waits before it; else a place in the queue. A slot
        another execution of the attempt holds is not shared."""
        with self._lock:
            held, waiting = self.slots.setdefault((activity, key), ({}, []))
            position = (run_id, seq)
            if position in held:
                if held[position] not in ("", holder):
                    return SlotTaken(held=False, in_use=len(held))
                held[position] = holder
                return SlotTaken(held=True, in_use=len(held))
            ahead = waiting[: waiting.index(position)] if position in waiting else waiting
            if len(held) < limit and not ahead:
                if position in waiting:
                    waiting.remove(position)
                held[position] = holder
                return SlotTaken(held=True, in_use=len(held))
            if position not in waiting:
                waiting.append(position)
            return SlotTaken(held=False, in_use=len(held))

    def release_activity_slot(
        self, activity: str, key: str, limit: int, run_id: str, seq: int, ttl: float, holder: str | None
    ) -> list[str]:
        with self._lock:
            held, waiting = self.slots.setdefault((activity, key), ({}, []))
            position = (run_id, seq)
            if position in held and held[position] == (holder or ""):
                del held[position]
            if holder is None and position in waiting:
                waiting.remove(position)
            woken = []
            while len(held) < limit and waiting:
                handed = waiting.pop(0)
                held[handed] = ""
                run, step = self.runs[handed[0]], self.runs[handed[0]].steps.get(handed[1])
                if step is None or step.status != StepStatus.DELAYED:
                    continue
                result = {**codec.loads(step.result_json or "{}"), "until": self.now.isoformat()}
                run.steps[handed[1]] = replace(step, result_json=codec.dumps(result))
                run.timers[(handed[1], TimerKind.RETRY)] = TimerWrite(handed[1], TimerKind.RETRY, self.now)
                if run.status == RunStatus.WAITING:
                    woken.append(run.run_id)
            return woken

    def renew_activity_slots(self, holders: list[tuple[str, int, str]], ttl: float) -> None:
        """Nothing to renew: slots here have no lease."""
