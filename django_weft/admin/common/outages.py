"""django_weft's admin views while the database does not answer: a 503 page saying so,
instead of a 500.

Only the views of django_weft's own ``ModelAdmin`` classes are wrapped (their URL
patterns, by :func:`answering_outages`), so the project's other admin pages and views
keep its own error handling; no middleware to add (docs/how-to/admin.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.template.response import SimpleTemplateResponse
from django.urls import URLPattern

from ...engine.run_logging import get_logger
from ...runtime.outages import DATABASE_UNAVAILABLE, RETRY_AFTER, database_unavailable

logger = get_logger("django_weft.admin")

TEMPLATE = "admin/django_weft/database_unavailable.html"


def answering_outages(patterns: list[URLPattern], site_header: str, site_title: str) -> list[URLPattern]:
    """``patterns`` with each view answering the database's absence with the 503 page."""
    for pattern in patterns:
        pattern.callback = _answering(pattern.callback, site_header, site_title)
    return patterns


def _answering(view: Callable[..., HttpResponse], site_header: str, site_title: str) -> Callable[..., Any]:
    @functools.wraps(view)
    def answering(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            response = view(request, *args, **kwargs)
            # A changelist reads most of its rows while its template renders: rendered
            # here, where a failure can still be answered.
            if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
                response.render()
            return response
        except DATABASE_UNAVAILABLE as exc:
            if not database_unavailable(exc):
                raise  # the code or the schema is wrong: a bug to see, not an outage
            logger.error("%s %s: the database is not answering (503): %s", request.method, request.path, exc)
            return unavailable_page(request, site_header, site_title)

    return answering


def unavailable_page(request: HttpRequest, site_header: str, site_title: str) -> HttpResponse:
    """The 503 page. Rendered without the request, whose context processors would read the
    user and the messages, and so the database, again."""
    html = render_to_string(
        TEMPLATE,
        {
            "title": "The database is not answering",
            "site_header": site_header,
            "site_title": site_title,
            "retry_url": request.get_full_path() if request.method == "GET" else request.path,
        },
    )
    response = HttpResponse(html, status=503)
    response["Retry-After"] = str(RETRY_AFTER)
    return response


__all__ = ["answering_outages", "unavailable_page"]
