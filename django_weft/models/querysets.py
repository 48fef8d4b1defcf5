"""Named filters used by the sweep and by operators' views."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, models
from django.db.models import Q
from django.db.models.fields.json import KeyTransform

from ..engine.errors import InvalidInput
from ..engine.records import ACTIVE_STATUSES, TERMINAL_STATUSES, RunStatus
from ..engine.registry import registry
from ..engine.search_attributes import NAME_RULE, is_attribute_name, search_values

if TYPE_CHECKING:
    from .runs import WorkflowRun  # noqa: F401
    from .timers import Timer  # noqa: F401


class WorkflowRunQuerySet(models.QuerySet["WorkflowRun"]):
    def active(self) -> WorkflowRunQuerySet:
        return self.filter(status__in=list(ACTIVE_STATUSES))

    def terminal(self) -> WorkflowRunQuerySet:
        return self.filter(status__in=list(TERMINAL_STATUSES))

    def runnable(self) -> WorkflowRunQuerySet:
        """Runs a worker may claim right now: running and unowned (matches the partial index)."""
        return self.filter(status=RunStatus.RUNNING, owner_id__isnull=True)

    def expired_leases(self, now: Any, grace: float) -> WorkflowRunQuerySet:
        """Owned runs whose lease expired more than ``grace`` seconds before ``now``."""
        return self.filter(owner_id__isnull=False, lease_expires_at__lt=now - timedelta(seconds=grace))

    def needing_dispatch(self, now: datetime, redispatch_after: float) -> WorkflowRunQuerySet:
        """Runnable runs nobody has rung the doorbell for recently."""
        return self.runnable().filter(
            Q(dispatched_at__isnull=True) | Q(dispatched_at__lt=now - timedelta(seconds=redispatch_after))
        )

    # -- flow control (docs/explanation/flow-control.md) -------------------------------

    def of_kind(self, kind: str) -> WorkflowRunQuerySet:
        """Runs of the registered workflows of ``kind``: ``"task"`` (tasks of Django's task
        framework, run by ``WeftTaskBackend``) or ``"workflow"``; by workflow name (its
        index), so a name this process has not registered is neither."""
        return self.filter(workflow_name__in=sorted(registry.workflow_names_of_kind(kind)))

    def queued_for_slot(self) -> WorkflowRunQuerySet:
        """Runs queued for a concurrency slot: ``pending`` until one frees (the condition
        of the partial index ``weft_run_flow_queue``)."""
        return self.filter(slot=self.model.Slot.QUEUED, status=RunStatus.PENDING)

    def not_queued_for_slot(self) -> WorkflowRunQuerySet:
        """Every run :meth:`queued_for_slot` leaves out."""
        return self.exclude(slot=self.model.Slot.QUEUED, status=RunStatus.PENDING)

    def holding_slot(self) -> WorkflowRunQuerySet:
        """Runs holding a concurrency slot: active, with ``slot`` ``held`` (within the
        partial index ``weft_run_flow_live``). A run gives its slot back by ending."""
        return self.filter(
            concurrency_key__isnull=False, status__in=sorted(ACTIVE_STATUSES), slot=self.model.Slot.HELD
        )

    def search(self, **attributes: Any) -> WorkflowRunQuerySet:
        """Runs whose search attributes contain ``attributes`` (JSON containment).

        On PostgreSQL this uses the partial GIN index on non-empty search attributes."""
        if not attributes:
            return self
        if connections[self.db].vendor != "postgresql":
            # SQLite has no JSON containment: compare key by key. The key is a key, never a
            # lookup: "a__regex" names the attribute "a__regex".
            runs = self
            for index, (key, value) in enumerate(attributes.items()):
                alias = f"weft_search_{index}"
                runs = runs.alias(**{alias: KeyTransform(key, "search_attributes")}).filter(**{alias: value})
            return runs
        return self.filter(search_attributes__contains=attributes).exclude(search_attributes={})

    def search_attribute(self, name: str, raw: str) -> WorkflowRunQuerySet:
        """Runs whose search attribute ``name`` holds a value the searched text ``raw``
        may stand for (:func:`~django_weft.engine.search_attributes.search_values`):
        ``"7"`` finds 7 and "7", ``"true"`` finds True and "true"; an integer past 64
        bits is matched as text only. The REST filter ``search.<attr>=<value>`` and the
        REST bulk jobs' filters search through this.

        Raises ``InvalidInput`` (``field`` ``"name"`` or ``"value"``) for a name that is
        not a search attribute name (:data:`~django_weft.engine.search_attributes.NAME_RULE`)
        or a text with a NUL character, which no database column holds."""
        if not isinstance(name, str) or not is_attribute_name(name):
            raise InvalidInput(f"A search attribute name is {NAME_RULE}.", field="name")
        if not isinstance(raw, str):
            raise InvalidInput(f"A searched value is a text; got {type(raw).__name__}.", field="value")
        if "\x00" in raw:
            raise InvalidInput("A search value must not contain a NUL character.", field="value")
        matches = [self.search(**{name: value}) for value in search_values(raw)]
        combined = matches[0]
        for extra in matches[1:]:
            combined = combined | extra
        return combined

    def for_workflow_id(self, workflow_id: str) -> WorkflowRunQuerySet:
        return self.filter(workflow_id=workflow_id).order_by("-created_at")


class TimerQuerySet(models.QuerySet["Timer"]):
    def unfired(self) -> TimerQuerySet:
        return self.filter(fired_at__isnull=True)

    def due(self, now: Any) -> TimerQuerySet:
        """Unfired timers whose fire time has come (matches the partial index)."""
        return self.filter(fired_at__isnull=True, fire_at__lte=now)
