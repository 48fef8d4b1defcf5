"""A JSON parser that refuses an oversized body before reading it."""

from __future__ import annotations

import codecs
import json
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
        length = request.META.get("CONTENT_LENGTH") if request is not None else None
        if length and str(length).isdigit() and int(length) > limit:
            raise too_large(int(length))
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise too_large()
        encoding = parser_context.get("encoding", "utf-8")
        try:
            text = codecs.decode(raw, encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise exceptions.ParseError(f"The body is not {encoding} text: {exc}") from None
        try:
            return json.loads(text, parse_constant=_refuse_constant)
        except ValueError as exc:
            raise exceptions.ParseError(f"The body is not valid JSON: {exc}") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")
