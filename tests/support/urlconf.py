"""The project's URL conf walked as text, so a generated test covers every route, a new
one included, without listing them by hand."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver


def patterns_under(prefix: str) -> Iterator[tuple[str, URLPattern]]:
    """(route, pattern) for every route whose text starts with ``prefix`` (for example
    ``api/weft/``): the route is the concatenated pattern text of its resolvers, regex or
    path syntax."""

    def walk(patterns: list[Any], above: str) -> Iterator[tuple[str, URLPattern]]:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, above + str(pattern.pattern))
            elif isinstance(pattern, URLPattern):
                yield above + str(pattern.pattern), pattern

    return ((route, p) for route, p in walk(get_resolver().url_patterns, "") if route.startswith(prefix))


def routes_under(prefix: str) -> Iterator[str]:
    """The text of every route under ``prefix`` (see :func:`patterns_under`)."""
    return (route for route, _ in patterns_under(prefix))
