from __future__ import annotations

from typing import ClassVar

from django.db import models


class Order(models.Model):
    """A customer's order. The ``orders.fulfil`` workflow moves it from new to fulfilled."""

    class Status(models.TextChoices):
        NEW = "new", "new"
        PAID = "paid", "paid"
        FULFILLED = "fulfilled", "fulfilled"

    customer = models.CharField(max_length=200)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.NEW)
    receipt = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering: ClassVar = ["-created_at"]

    def __str__(self) -> str:
        return f"order {self.pk} for {self.customer} ({self.status})"

    @property
    def workflow_id(self) -> str:
        """The business key of this order's fulfilment run: one live run per order."""
        return f"order-{self.pk}"
