"""Moved to :mod:`django_weft.runtime.dispatch`; this path stays importable because
``WEFT_DISPATCHER`` settings name ``django_weft.dispatch.SweepOnlyDispatcher``."""

from __future__ import annotations

from .runtime.dispatch import (
    Dispatcher,
    LocalDispatcher,
    SweepOnlyDispatcher,
    Work,
    _instantiate,
    _process_override,
    delivers,
    get_dispatcher,
    use_dispatcher,
)

__all__ = [
    "Dispatcher",
    "LocalDispatcher",
    "SweepOnlyDispatcher",
    "Work",
    "_instantiate",
    "_process_override",
    "delivers",
    "get_dispatcher",
    "use_dispatcher",
]
