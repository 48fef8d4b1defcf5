from __future__ import annotations

from django.db import models


class SideEffect(models.Model):
    """One row per execution of a test activity body (counts executions)."""

    key = models.CharField(max_length=200, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.key


class LedgerEntry(models.Model):
    """Written by atomic activities; unique per key so a double commit would fail loudly."""

    key = models.CharField(max_length=200, unique=True)
    amount = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.key}: {self.amount}"
