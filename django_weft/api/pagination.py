"""Cursor pagination of runs: newest first, stable under inserts, never a ``COUNT(*)``."""

from __future__ import annotations

from rest_framework.pagination import CursorPagination


class RunCursorPagination(CursorPagination):
    """Ordered by ``(-created_at, id)``, which the ``weft_run_created`` index serves; the
    cursor is opaque. ``?page_size=`` up to 500."""

    ordering = ("-created_at", "id")
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
