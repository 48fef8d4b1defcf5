"""Fixtures of the engine tests: the real Engine on the in-memory store, no Django.

Nothing here (or in the engine test modules) may import Django, Celery or DRF: the
engine tests also run with those blocked (test_import_boundaries.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from django_weft.engine import faults
from django_weft.engine.executor import Engine, EngineConfig, TurnOutcome
from django_weft.engine.records import StepRecord
from django_weft.engine.registry import Registry, Workflow
from django_weft.engine.retry import RetryPolicy
from django_weft.engine.testing.memory_store import MemoryStore, RecordingDispatcher, memory_engine


@dataclass
class Harness:
    """An engine, its store and dispatcher, and the workflows it runs (its own registry)."""

    engine: Engine
    store: MemoryStore
    dispatcher: RecordingDispatcher
    workflows: Registry

    def workflow(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register (or replace, as a deploy would) the workflow ``name``."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.workflows.workflows[name] = Workflow(fn=fn, name=name)
            return fn

        return register

    def turn(self, run_id: str) -> TurnOutcome:
        return self.engine.run_turn(run_id)

    def history(self, run_id: str) -> list[tuple[int, str, str, str]]:
        return [(s.seq, s.kind, s.name, s.status) for s in self.store.history(run_id)]

    def step(self, run_id: str, seq: int) -> StepRecord:
        return next(s for s in self.store.history(run_id) if s.seq == seq)


@pytest.fixture
def weft() -> Iterator[Harness]:
    config = EngineConfig(default_retry=RetryPolicy(max_attempts=1), inline_retry_max_delay=0.05)
    workflows = Registry()
    engine, store, dispatcher = memory_engine(workflows, config)
    yield Harness(engine, store, dispatcher, workflows)
    faults.disarm()
