"""The workload's own tables: what the driver planned, and what its activities wrote."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class PlannedOrder(models.Model):
    """An order run the driver meant to start, written before the start: the invariants
    compare the runs against this, so a start that was lost is seen."""

    key = models.CharField(max_length=100, unique=True)
    signals = models.PositiveIntegerField()
    signals_sent = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.key


class LedgerRow(models.Model):
    """Written by the atomic ledger step, in the transaction that records the step. No
    unique constraint on purpose: a second row for a key is what the invariant looks for."""

    key = models.CharField(max_length=100, db_index=True)
    run_id = models.UUIDField()
    amount = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.key}: {self.amount}"


class Effect(models.Model):
    """One row per execution of a non-atomic activity body (at least once: a crash between
    the body and its record runs it again). Counted for the figures, not an invariant."""

    key = models.CharField(max_length=150, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.key


class SlotMark(models.Model):
    """Written by the concurrency-limited workflow's atomic steps as it enters (its first
    step) and leaves (its last): the span between a run's two marks lies within the time
    it held its concurrency slot. ``at`` is the database's clock, so the spans of runs on
    different worker processes compare. No unique constraint: a second mark for a run is
    what the invariant looks for."""

    run_id = models.UUIDField(db_index=True)
    key = models.CharField(max_length=100)
    lane = models.CharField(max_length=20)
    edge = models.CharField(max_length=10)
    at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"{self.key} {self.edge} {self.lane}"
