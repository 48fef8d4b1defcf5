"""Search attributes set from workflow code: what ``ctx.set_search_attributes`` accepts,
and how it is stored and recorded.

A run's search attributes are one flat JSON object (``WorkflowRun.search_attributes``),
searched by key and value: ``WorkflowRun.objects.search(customer=7)``, REST
``search.customer=7`` and the admin's ``customer=7``. So a value must be one that those
searches can match: a string, a number, a boolean, or a date or time (stored as its ISO
8601 text). ``None`` removes the key.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Any

from .errors import InvalidInput

ATTRIBUTE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,99}")
"""A name the REST ``search.<attr>`` filter and the admin's ``attr=value`` search accept
(also without a double underscore)."""

NAME_RULE = "letters, digits, _ and - (no double _), starting with a letter or _, at most 100 characters"
"""The rule :func:`is_attribute_name` applies, in words, for error messages."""


def is_attribute_name(name: str) -> bool:
    """Whether ``name`` can be a search attribute's name (:data:`NAME_RULE`): the REST
    ``search.<attr>`` filter and the admin's ``attr=value`` search can name it, and a
    double underscore cannot reach into a lookup."""
    return ATTRIBUTE_NAME.fullmatch(name) is not None and "__" not in name


RESERVED_PREFIX = "weft_"
"""Attributes django_weft sets itself (a scheduled run's ``weft_schedule_id`` and
``weft_scheduled_at``); workflow code may read them but not set them."""

MAX_STEP_NAME_LENGTH = 200
"""``Step.name``'s length: the recorded step's name is the attribute names, cut to fit."""

_MAX_INTEGER = 2**63
"""Integers are compared as 64-bit numbers by the searches; larger ones as text only."""


def search_values(raw: str) -> tuple[Any, ...]:
    """The values a searched text may stand for, the text first: ``7`` is "7" or 7,
    ``1.5`` is "1.5" or 1.5, ``true`` is "true" or True, ``null`` is "null" or None.
    A number no JSON document holds (``1e999``) and an integer past the 64-bit ones the
    searches compare (which :func:`check_search_attributes` refuses to store as a number)
    are text only."""
    values: list[Any] = [raw]
    try:
        parsed = json.loads(raw, parse_constant=_not_a_number)
    except ValueError:
        return tuple(values)
    if isinstance(parsed, float) and not math.isfinite(parsed):
        return tuple(values)
    if isinstance(parsed, int) and not isinstance(parsed, bool) and abs(parsed) >= _MAX_INTEGER:
        return tuple(values)
    if isinstance(parsed, bool | int | float) or parsed is None:
        values.append(parsed)
    return tuple(values)


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def check_search_attributes(attributes: Any) -> dict[str, Any]:
    """``attributes`` as they will be stored, or :class:`InvalidInput` saying what to fix.

    Keys are attribute names (see :data:`ATTRIBUTE_NAME`, not starting with ``weft_``);
    values are ``None`` (remove the key), ``str``, ``int``, finite ``float``, ``bool``,
    or a ``datetime`` (timezone-aware; stored as UTC ISO 8601 text ending in ``Z``, like
    ``weft_scheduled_at``) or ``date`` (``YYYY-MM-DD``). Lists and dicts are refused: a
    search compares one value per key."""
    if not isinstance(attributes, Mapping):
        raise InvalidInput(
            f"ctx.set_search_attributes takes a dict of attribute names to values; got "
            f"{type(attributes).__name__}"
        )
    checked: dict[str, Any] = {}
    for key, value in attributes.items():
        checked[_check_name(key)] = _stored_value(key, value)
    return checked


def step_name(attributes: Mapping[str, Any]) -> str:
    """The recorded step's name: the attribute names, sorted and comma-separated (cut to
    :data:`MAX_STEP_NAME_LENGTH`). Replay matches on it, so setting other attributes at
    a recorded position is a non-determinism; their values may differ."""
    name = ",".join(sorted(attributes))
    return name if len(name) <= MAX_STEP_NAME_LENGTH else name[: MAX_STEP_NAME_LENGTH - 1] + "\u2026"


def _check_name(key: Any) -> str:
    if not isinstance(key, str):
        raise InvalidInput(f"a search attribute name must be a string; got {type(key).__name__} {key!r}")
    if not is_attribute_name(key):
        raise InvalidInput(
            f"search attribute name {key!r} is not allowed: use {NAME_RULE}, so that the REST and "
            "admin searches can name it"
        )
    if key.lower().startswith(RESERVED_PREFIX):
        raise InvalidInput(
            f"search attribute name {key!r} is reserved: names starting with {RESERVED_PREFIX!r} are "
            "set by django_weft (a schedule's weft_schedule_id and weft_scheduled_at); choose another name"
        )
    return key


def _stored_value(key: str, value: Any) -> Any:
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, int):
        if abs(value) >= _MAX_INTEGER:
            raise InvalidInput(
                f"search attribute {key!r}: {value} is outside the 64-bit integers the searches "
                "compare; store it as a string"
            )
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput(
                f"search attribute {key!r}: {value} is not a finite number, which JSON cannot hold"
            )
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidInput(
                f"search attribute {key!r}: the datetime {value.isoformat()} has no timezone; pass an "
                "aware datetime (such as ctx.now()) so that it is stored as one instant"
            )
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, list | tuple | set | frozenset | Mapping):
        raise InvalidInput(
            f"search attribute {key!r}: a {type(value).__name__} is not a search attribute value; "
            "a search compares one str, int, float, bool or date/datetime per name (set several "
            "names, or join the values into a string)"
        )
    raise InvalidInput(
        f"search attribute {key!r}: {type(value).__name__} is not a search attribute value; use "
        "str, int, float, bool, a date/datetime, or None to remove the attribute"
    )
