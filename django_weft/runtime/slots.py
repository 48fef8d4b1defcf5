"""Concurrency slots as an operator sees them: the busiest concurrency keys (the admin's
dashboard and ``weft_status``), and a run's slot with its key's figures read now (the
admin's run page).

Reads only. The figures are counted from the runs themselves, as the claims count them
(docs/explanation/flow-control.md): slots in use are the active runs holding one; the
limit is the one the workflow declares in this process's code.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Case, CharField, Count, F, Min, Q, Value, When

from ..engine.flow import Concurrency, queued_reason
from ..engine.records import ACTIVE_STATUSES, RunStatus
from ..engine.registry import registry
from ..models import WorkflowRun
from .process import get_store

BUSIEST_SHOWN = 10
"""How many concurrency keys the dashboard and ``weft_status`` list."""

_HELD = WorkflowRun.Slot.HELD
_QUEUED = WorkflowRun.Slot.QUEUED
_QUEUED_NOW = Q(slot=_QUEUED, status=RunStatus.PENDING)


@dataclass(frozen=True)
class KeyFigures:
    """One group of a concurrency limit: a workflow and a key, or a whole workflow (a
    limit without a key, or ``scope="workflow"``, whose keys share its slots)."""

    workflow: str
    key: str
    """The key; ``""`` when the limit counts the whole workflow."""
    in_use: int
    """Active runs holding a slot."""
    limit: int | None
    """The slots the workflow declares; ``None`` when it is not registered in this process
    (its runs' keys are then shown one by one)."""
    queued: int
    """Runs queued for a slot (``pending``)."""
    oldest_queued_at: datetime | None
    """When the run queued longest was queued (a queued run's ``updated_at``: nothing
    changes a queued run until it is let in or ends)."""

    @property
    def whole_workflow(self) -> bool:
        return self.key == ""


@dataclass(frozen=True)
class BusiestKeys:
    """The concurrency keys with the most runs queued, then the most slots in use."""

    keys: tuple[KeyFigures, ...]
    read_at: datetime
    """The database clock when they were read."""


def busiest_keys(
    top: int = BUSIEST_SHOWN, *, now: datetime | None = None, may_lag: bool = False
) -> BusiestKeys:
    """The ``top`` groups with the most runs queued for a slot, then the most slots in use
    (then by workflow and key); groups with neither are left out. ``now`` (the figures'
    ``read_at``) defaults to the database clock.

    One grouped query over the active runs of limited workflows holding or queued for a
    slot: its ``WHERE`` is within the partial index ``weft_run_flow_live`` (active runs
    with a key), so it reads those runs and never the rest of the table. A workflow with
    ``scope="workflow"`` is one group whatever its keys, as its limit counts. ``may_lag``:
    read from ``WEFT_READ_DATABASE``."""
    store = get_store(may_lag=may_lag)
    limits = registry.concurrency_limits()
    shared = sorted(name for name, limit in limits.items() if limit.per_workflow)
    group: Any = F("concurrency_key")
    if shared:
        group = Case(
            When(workflow_name__in=shared, then=Value("")),
            default=F("concurrency_key"),
            output_field=CharField(),
        )
    rows = (
        WorkflowRun.objects.using(store.alias)
        .filter(concurrency_key__isnull=False, status__in=sorted(ACTIVE_STATUSES), slot__in=[_HELD, _QUEUED])
        .order_by()
        .annotate(group=group)
        .values("workflow_name", "group")
        .annotate(
            in_use=Count("pk", filter=Q(slot=_HELD)),
            queued=Count("pk", filter=_QUEUED_NOW),
            oldest=Min("updated_at", filter=_QUEUED_NOW),
        )
        .order_by("-queued", "-in_use", "workflow_name", "group")[: max(int(top), 0)]
    )
    keys = tuple(
        KeyFigures(
            workflow=row["workflow_name"],
            key=row["group"],
            in_use=row["in_use"],
            limit=limits[row["workflow_name"]].limit if row["workflow_name"] in limits else None,
            queued=row["queued"],
            oldest_queued_at=row["oldest"],
        )
        for row in rows
    )
    return BusiestKeys(keys=keys, read_at=now if now is not None else store.db_now())


@dataclass(frozen=True)
class RunSlot:
    """A run's place under its workflow's concurrency limit, with its group's figures
    read now."""

    key: str
    """Its concurrency key (``""``: one limit for the workflow)."""
    slot: str
    """``held``, ``queued`` or ``""`` (none: a delayed start not due yet, a child or a
    successor not claimed yet, or a finished run)."""
    limit: Concurrency | None
    """The workflow's limit in this process's code; ``None`` when it is not registered here."""
    in_use: int | None
    """Slots of its group in use now; ``None`` when the limit is unknown here."""

    @property
    def queued(self) -> bool:
        return self.slot == _QUEUED

    @property
    def reason(self) -> str:
        """Why a queued run waits, with the figures of now ("queued: concurrency key
        customer-7 (1 of 1 in use)"); ``""`` for a run that is not queued, or whose
        workflow is not registered here."""
        if not self.queued or self.limit is None or self.in_use is None:
            return ""
        limit = self.limit
        return str(queued_reason(self.key, limit.limit, self.in_use, per_workflow=limit.per_workflow)["text"])


def run_slot(run: WorkflowRun) -> RunSlot | None:
    """``run``'s slot and its group's slots in use now (one count on the partial index
    ``weft_run_flow_live``, for an active run whose workflow is registered here, on the
    database ``run`` was read from); ``None`` for a run of a workflow without a
    concurrency limit."""
    if run.concurrency_key is None:
        return None
    active = run.status in ACTIVE_STATUSES
    slot = str(run.slot) if active else ""
    limit = registry.concurrency_limits().get(run.workflow_name)
    in_use = None
    if limit is not None and active:
        in_use = get_store(same_database_as=run).flow.held(run.workflow_name, run.concurrency_key, limit)
    return RunSlot(key=run.concurrency_key, slot=slot, limit=limit, in_use=in_use)


__all__ = ["BUSIEST_SHOWN", "BusiestKeys", "KeyFigures", "RunSlot", "busiest_keys", "run_slot"]
