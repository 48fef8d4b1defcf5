"""A JSON parser that refuses an oversized body before reading it."""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Mapping
from typing import IO, Any

from rest_framework import exceptions
from rest_framework.parsers import JSONParser

from ..conf import weft_settings
from .exceptions import PayloadTooLarge


def body_limit() -> int:
    return weft_settings.API_MAX_BODY_BYTES


def too_large(size: int | None = None) -> PayloadTooLarge:
    limit = body_limit()
    said = f" ({size} bytes)" if size is not None else ""
    return PayloadTooLarge(
        f"The request body{said} is larger than the {limit} bytes this API accepts "
        "(WEFT_API_MAX_BODY_BYTES); send a smaller payload."
    )


class BoundedJSONParser(JSONParser):
    """JSON, at most ``WEFT_API_MAX_BODY_BYTES``: decided from ``Content-Length`` before
    anything is read, and from the bytes read when there is no length (chunked bodies)."""

    def parse(
        self,
        stream: IO[bytes],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        parser_context = parser_context or {}
        limit = body_limit()
        request = parser_context.get("request")
        declared = declared_length(request.META if request is not None else {})
        if declared is not None and declared > limit:
            raise too_large(declared)
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise too_large()
        encoding = str(parser_context.get("encoding") or "utf-8")
        try:
            known = codecs.lookup(encoding).name
        except LookupError:
            known = ""
        if known not in ("utf-8", "ascii"):
            # Only text encodings of JSON: a charset such as zlib or hex would decode
            # (and inflate) bytes before any limit applies.
            raise exceptions.UnsupportedMediaType(
                f"application/json; charset={encoding}", detail="Send JSON in UTF-8 (charset=utf-8)."
            )
        try:
            text = raw.decode(known)
        except UnicodeDecodeError as exc:
            raise exceptions.ParseError(f"The body is not {encoding} text: {exc}") from None
        try:
            value = json.loads(text, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            raise exceptions.ParseError(f"The body is not valid JSON: {exc}") from None
        if nesting_depth(value) > MAX_DEPTH:
            raise exceptions.ParseError(f"The body nests JSON deeper than {MAX_DEPTH} levels.")
        return value


MAX_DEPTH = 64
"""How deeply a request body may nest arrays and objects."""


def nesting_depth(value: Any) -> int:
    """The nesting depth of a decoded JSON value, without recursion."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            pending.extend((child, depth + 1) for child in item if isinstance(child, dict | list))
    return deepest


def declared_length(meta: Mapping[str, Any]) -> int | None:
    """The request's ``Content-Length`` as a number, or ``None`` when absent or not a number."""
    length = meta.get("CONTENT_LENGTH")
    if length and re.fullmatch(r"[0-9]+", str(length)):
        return int(length)
    return None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")
