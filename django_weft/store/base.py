"""Plumbing every part of the store shares: the database alias and connection, the
fencing error, and Django signals sent on commit."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.functions import Now
from django.dispatch import Signal
from django.utils import timezone

from .. import signals
from ..conf import weft_settings
from ..engine import clock, codec
from ..engine.error_types import UPDATE_ERROR_ON_CLOSE, ErrorType
from ..engine.errors import (
    Deposed,
)
from ..engine.records import (
    RunStatus,
)
from ..models import WorkflowRun
from ..models.querysets import WorkflowRunQuerySet

logger = logging.getLogger("django_weft.store")


def _unanswered_error(status: str) -> dict[str, str]:
    return {
        # A run its workflow ended cancelled answers as an external cancel would.
        "type": UPDATE_ERROR_ON_CLOSE.get(status, ErrorType.RUN_FINISHED),
        "message": f"the run finished ({status}) before it applied this update",
    }


def _deposed(run_id: str, owner: str, epoch: int, what: str) -> Deposed:
    return Deposed(
        f"run {run_id}: {what} rejected, engine {owner} no longer owns it at epoch {epoch}",
        run_id=run_id,
        owner=owner,
        epoch=epoch,
    )


class StoreBase:
    """The database the store works on; the parts of :class:`DjangoStore` build on it."""

    def __init__(self, alias: str | None = None) -> None:
        self._alias = alias

    @property
    def alias(self) -> str:
        return self._alias or weft_settings.DATABASE_ALIAS

    @property
    def connection(self) -> BaseDatabaseWrapper:
        return connections[self.alias]

    @property
    def is_postgres(self) -> bool:
        return self.connection.vendor == "postgresql"

    @property
    def _clock_in_sql(self) -> bool:
        """Whether a statement reads the time itself (PostgreSQL's ``now()``): on
        PostgreSQL unless a virtual clock is installed, whose time is bound instead."""
        return self.connection.vendor == "postgresql" and clock.installed() is None

    def _local_now(self) -> datetime:
        """The time, without a round trip: the virtual clock's if one is installed, else the
        process's clock (SQLite's database clock; a stamp that needs no precision)."""
        virtual = clock.installed()
        return timezone.now() if virtual is None else virtual.now()

    def _now_value(self) -> Any:
        """The time to write in an ORM update: the database's ``Now()`` (so the statement
        is what it is without the seam), or the virtual clock's time as a value."""
        virtual = clock.installed()
        return Now() if virtual is None else virtual.now()

    def _run_key(self, run_id: str | uuid.UUID) -> Any:
        value = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
        return WorkflowRun._meta.pk.get_db_prep_value(value, self.connection)

    def _dt(self, value: datetime | None) -> Any:
        return self.connection.ops.adapt_datetimefield_value(value)

    def _runs(self) -> WorkflowRunQuerySet:
        return WorkflowRun.objects.using(self.alias)

    def _owned(self, run_id: str, owner: str, epoch: int) -> WorkflowRunQuerySet:
        return self._runs().filter(pk=run_id, owner_id=owner, owner_epoch=epoch)

    def _announce_finish(
        self, run_id: str, workflow_id: str, workflow_name: str, status: str, error_json: str | None
    ) -> None:
        if status == RunStatus.COMPLETED:
            self._announce(signals.run_completed, run_id, workflow_id, workflow_name)
        elif status in (RunStatus.FAILED, RunStatus.CANCELLED):
            error = codec.loads(error_json) if error_json else None
            signal = signals.run_failed if status == RunStatus.FAILED else signals.run_cancelled
            self._announce(signal, run_id, workflow_id, workflow_name, error=error)

    def _announce(
        self, signal: Signal, run_id: uuid.UUID | str, workflow_id: str, workflow_name: str, **extra: Any
    ) -> None:
        """Send a Django signal once the current transaction commits (at once in autocommit)."""
        if not signal.has_listeners(WorkflowRun):
            return

        def send() -> None:
            for receiver, response in signal.send_robust(
                sender=WorkflowRun,
                run_id=str(run_id),
                workflow_id=workflow_id,
                workflow_name=workflow_name,
                **extra,
            ):
                if isinstance(response, Exception):
                    logger.error(
                        "run %s: receiver %r of a django_weft signal raised",
                        run_id,
                        receiver,
                        exc_info=response,
                    )

        transaction.on_commit(send, using=self.alias)
