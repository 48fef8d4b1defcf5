"""Run-scoped log records: every record django_weft writes about a run carries the run's
fields in ``extra``, so a JSON formatter (docs/how-to/observe.md) can index them.

The fields are ``run_id``, ``workflow_id``, ``workflow``, and where known ``seq`` (a
position in the run's history) and ``attempt`` (an activity attempt's number, or for
``ctx.logger`` the run's attempt). They come from the context the record is written in:
an activity attempt (:func:`~django_weft.engine.attempt.activity_info`), else the
fields a turn, a queued attempt's handling or the runtime bound with :func:`bound`. A
field passed in ``extra`` explicitly wins.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

FIELDS = ("run_id", "workflow_id", "workflow", "seq", "attempt")
"""The ``extra`` keys of a run's log records."""

_bound: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "weft_log_fields", default=None
)


def current() -> Mapping[str, Any]:
    """The run fields of the code running now: an activity attempt's, else those bound.
    Read only when a record is written (a logger adapter calls it for enabled records),
    so an attempt costs nothing here: its fields come from ``activity_info()``."""
    from .attempt import _current_activity  # the attempt module logs through this one

    info = _current_activity.get()
    if info is not None:
        return info.log_fields
    return _bound.get() or {}


@contextlib.contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Within the block, records carry ``fields`` (``None`` values left out) on top of
    the fields bound around it."""
    outer = _bound.get() or {}
    token = _bound.set({**outer, **{key: value for key, value in fields.items() if value is not None}})
    try:
        yield
    finally:
        _bound.reset(token)


def fields_of(run_id: Any, workflow_id: str | None = None, workflow: str | None = None) -> dict[str, Any]:
    """The ``extra`` of a record about a run, outside its turns and attempts."""
    fields: dict[str, Any] = {"run_id": str(run_id)}
    if workflow_id is not None:
        fields["workflow_id"] = workflow_id
    if workflow is not None:
        fields["workflow"] = workflow
    return fields


def merged_extra(fields: Mapping[str, Any], kwargs: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """``kwargs`` with ``fields`` under its ``extra`` (its own keys win)."""
    if fields:
        kwargs["extra"] = {**fields, **(kwargs.get("extra") or {})}
    return kwargs


class RunLogger(logging.LoggerAdapter[logging.Logger]):
    """A package logger whose records carry the current run's fields (:func:`current`)."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger, {})

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, merged_extra(current(), kwargs)


class FieldsLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger whose records carry the given run fields (an activity's logger)."""

    def __init__(self, logger: logging.Logger, fields: Mapping[str, Any]) -> None:
        super().__init__(logger, dict(fields))

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, merged_extra(self.extra or {}, kwargs)


def get_logger(name: str) -> RunLogger:
    """``logging.getLogger(name)`` wrapped in a :class:`RunLogger`."""
    return RunLogger(logging.getLogger(name))
