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
    slots: dict[tuple[str, str], tuple[set[tuple[str, int]], list[tuple[str, int]]]]
    """Activity concurrency slots by (activity, key): the holders, and the queue."""

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
        self, activity: str, key: str, limit: int, run_id: str, seq: int, ttl: float
    ) -> SlotTaken:
        """The Django store's rule without leases (nothing crashes here): a slot handed on,
        or a free one when no attempt waits before it; else a place in the queue."""
        with self._lock:
            held, waiting = self.slots.setdefault((activity, key), (set(), []))
            holder = (run_id, seq)
            if holder in held:
                return SlotTaken(held=True, in_use=len(held))
            ahead = waiting[: waiting.index(holder)] if holder in waiting else waiting
            if len(held) < limit and not ahead:
                if holder in waiting:
                    waiting.remove(holder)
                held.add(holder)
                return SlotTaken(held=True, in_use=len(held))
            if holder not in waiting:
                waiting.append(holder)
            return SlotTaken(held=False, in_use=len(held))

    def release_activity_slot(
        self, activity: str, key: str, limit: int, run_id: str, seq: int, ttl: float
    ) -> list[str]:
        with self._lock:
            held, waiting = self.slots.setdefault((activity, key), (set(), []))
            held.discard((run_id, seq))
            if (run_id, seq) in waiting:
                waiting.remove((run_id, seq))
            woken = []
            while len(held) < limit and waiting:
                holder = waiting.pop(0)
                held.add(holder)
                run, step = self.runs[holder[0]], self.runs[holder[0]].steps.get(holder[1])
                if step is None or step.status != StepStatus.DELAYED:
                    continue
                result = {**codec.loads(step.result_json or "{}"), "until": self.now.isoformat()}
                run.steps[holder[1]] = replace(step, result_json=codec.dumps(result))
                run.timers[(holder[1], TimerKind.RETRY)] = TimerWrite(holder[1], TimerKind.RETRY, self.now)
                if run.status == RunStatus.WAITING:
                    woken.append(run.run_id)
            return woken

    def renew_activity_slots(self, holders: list[tuple[str, int]], ttl: float) -> None:
        """Nothing to renew: slots here have no lease."""
