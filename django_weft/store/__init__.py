"""The ORM adapter of the engine's store port: every fenced write lives here.

Split by caller: :mod:`.turns` and :mod:`.turn_messages` (the engine's port),
:mod:`.intake` (new runs, signals, updates), :mod:`.transitions` (cancel, suspend,
resume, retry), :mod:`.resets` (reset to a position), :mod:`.attempts` and
:mod:`.finalizers` (work on workers),
:mod:`.children`, :mod:`.sweep`, :mod:`.retention`, :mod:`.schedules`, :mod:`.bulk` (bulk
jobs); :mod:`.waking` reads what the engine's wait decisions need; every raw statement is
in :mod:`.sql`, the shared plumbing in :mod:`.base`. Callers see one class,
:class:`DjangoStore`.
"""

from __future__ import annotations

from .bulk import BulkJobsMixin
from .intake import IntakeMixin
from .resets import ResetsMixin
from .retention import PurgedBatch, RetentionMixin, RetentionScan
from .schedules import SchedulesMixin
from .sweep import SweepMixin
from .turn_messages import TurnMessagesMixin
from .turns import TurnsMixin


class DjangoStore(
    TurnsMixin,
    TurnMessagesMixin,
    IntakeMixin,
    SweepMixin,
    RetentionMixin,
    SchedulesMixin,
    BulkJobsMixin,
    ResetsMixin,
):
    """The engine's :class:`~django_weft.engine.ports.TurnStore` on a Django database."""


__all__ = ["DjangoStore", "PurgedBatch", "RetentionScan"]
