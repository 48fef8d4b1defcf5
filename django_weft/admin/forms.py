"""What operators type into the admin, parsed: for now the run changelist's search box.

``order-42`` is a workflow id, a UUID is a run id (or a workflow id that looks like one),
``customer=7`` matches the search attribute ``customer`` (7 the number or "7" the
string). Terms separated by spaces must all match.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

ATTRIBUTE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,99}")


class SearchError(ValueError):
    """A search term that cannot match anything as typed; the message says what to fix."""


@dataclass(frozen=True)
class RunSearch:
    """A parsed changelist search: every part must match."""

    ids: tuple[str, ...] = ()
    """Terms that are a run id or a workflow id."""
    attributes: tuple[tuple[str, tuple[Any, ...]], ...] = field(default=())
    """``(name, candidate values)`` pairs: the attribute equals any of the candidates."""


def parse_run_search(term: str) -> RunSearch:
    """Split the search box's text into ids and ``attr=value`` conditions.

    Raises :class:`SearchError` for an attribute name that is not letters, digits, ``_``
    and ``-`` (starting with a letter or ``_``, no ``__``), an ``=`` with nothing before
    it, or a NUL character (no database column holds one)."""
    if "\x00" in term:
        raise SearchError("the search contains a NUL character; remove it")
    ids: list[str] = []
    attributes: list[tuple[str, tuple[Any, ...]]] = []
    for part in term.split():
        if "=" not in part:
            ids.append(part)
            continue
        name, _, raw = part.partition("=")
        if not ATTRIBUTE_NAME.fullmatch(name) or "__" in name:
            raise SearchError(
                f"{part!r}: a search attribute name is letters, digits, _ and - (no double _), "
                "starting with a letter or _ (search attr=value)"
            )
        attributes.append((name, candidate_values(raw)))
    return RunSearch(tuple(ids), tuple(attributes))


def candidate_values(raw: str) -> tuple[Any, ...]:
    """The typed values a typed text may stand for: ``7`` is "7" or 7, ``true`` is "true" or True."""
    values: list[Any] = [raw]
    try:
        parsed = json.loads(raw, parse_constant=_not_a_number)
    except ValueError:
        return tuple(values)
    if isinstance(parsed, float) and not math.isfinite(parsed):
        return tuple(values)  # 1e999: no JSON document holds it
    if isinstance(parsed, int) and not isinstance(parsed, bool) and abs(parsed) >= 2**63:
        return tuple(values)  # past a 64-bit integer: compared as text only
    if isinstance(parsed, bool | int | float) or parsed is None:
        values.append(parsed)
    return tuple(values)


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def as_run_id(text: str) -> uuid.UUID | None:
    """``text`` as a run id, or ``None`` when it is not a UUID."""
    try:
        return uuid.UUID(text)
    except ValueError:
        return None
