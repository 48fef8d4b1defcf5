"""JSON encoding of arguments, results and payloads.

The standard :mod:`json` module is used (orjson when installed). Values are always
handed back to workflow code *decoded from their stored form*, live and on replay
alike, so a tuple becomes a list in both cases and replay sees exactly what the first
execution saw.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import PayloadError

try:  # pragma: no cover - exercised only where orjson is installed
    import orjson  # type: ignore[import-not-found,unused-ignore]

    def _dumps(value: Any) -> str:
        return orjson.dumps(value).decode()

    _loads = orjson.loads
    _ENCODE_ERRORS: tuple[type[BaseException], ...] = (TypeError, orjson.JSONEncodeError)
except ImportError:
    _encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))

    def _dumps(value: Any) -> str:
        return _encoder.encode(value)

    _loads = json.loads
    _ENCODE_ERRORS = (TypeError, ValueError, OverflowError, RecursionError)


# An escaped NUL in JSON text: "\u0000" after an even number of backslashes.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def text_flaw(text: str) -> str | None:
    """What keeps ``text`` from being a name or key any database stores and any surface
    shows: ``"a control character"`` (a NUL included), ``"a lone surrogate"``, or None."""
    if any(ord(ch) < 32 for ch in text):
        return "a control character"
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            return "a lone surrogate"
    return None


def dumps(value: Any, *, what: str = "value", limit: int | None = None) -> str:
    """Encode ``value`` as JSON text, or raise :class:`PayloadError` saying what to fix."""
    try:
        text = _dumps(value)
    except _ENCODE_ERRORS as exc:
        raise PayloadError(
            f"{what} must be JSON-serialisable (dicts, lists, strings, numbers, booleans, None): {exc}"
        ) from None
    size = len(text)  # bytes of UTF-8, once known to be more than the characters
    if not text.isascii():
        try:
            size = len(text.encode())
        except UnicodeEncodeError as exc:
            raise PayloadError(
                f"{what} contains a lone surrogate ({text[exc.start]!r}), which is not text any "
                "database can store; send valid Unicode strings"
            ) from None
    if "\\u0000" in text and _NUL.search(text):
        raise PayloadError(
            f"{what} contains a NUL character (\\u0000) in a string, which PostgreSQL cannot store "
            "in JSON; remove it or encode binary data (e.g. as base64)"
        )
    if limit is not None and size > limit:
        raise PayloadError(
            f"{what} is {size} bytes of JSON, over the limit of {limit} bytes "
            "(WEFT_MAX_PAYLOAD_BYTES); store large data elsewhere and pass a reference"
        )
    return text


def loads(text: str | bytes | None) -> Any:
    if text is None:
        return None
    return _loads(text)


def roundtrip(value: Any, *, what: str = "value") -> tuple[Any, str]:
    """Return ``(decoded, encoded)``: the value as replay will see it, and its JSON text."""
    text = dumps(value, what=what)
    return _loads(text), text
