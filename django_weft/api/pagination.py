"""Cursor pagination of runs (newest first) and schedules (by id): stable under inserts,
never a ``COUNT(*)``."""

from __future__ import annotations

import re
from typing import Any

from django.utils.dateparse import parse_datetime
from rest_framework.exceptions import NotFound
from rest_framework.pagination import Cursor, CursorPagination

from ..models.schedules import SCHEDULE_ID_MAX_LENGTH


class RunCursorPagination(CursorPagination):
    """Ordered by ``(-created_at, id)``, which the ``weft_run_created`` index serves; the
    cursor is opaque. ``?page_size=`` up to 500."""

    ordering = ("-created_at", "id")
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def decode_cursor(self, request: Any) -> Cursor | None:
        cursor: Cursor | None = super().decode_cursor(request)
        # The position is a creation time; anything else is a tampered cursor.
        if cursor is not None and cursor.position is not None:
            try:
                valid = parse_datetime(cursor.position) is not None
            except ValueError:
                valid = False
            if not valid:
                raise NotFound(self.invalid_cursor_message)
        return cursor


class ScheduleCursorPagination(CursorPagination):
    """Ordered by id (the primary key); the cursor is opaque. ``?page_size=`` up to 500."""

    ordering = ("id",)
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def decode_cursor(self, request: Any) -> Cursor | None:
        cursor: Cursor | None = super().decode_cursor(request)
        # The position is a schedule id; anything else (a NUL the database would refuse)
        # is a tampered cursor.
        position = cursor.position if cursor is not None else None
        if position is not None and not (
            len(position) <= SCHEDULE_ID_MAX_LENGTH and re.fullmatch(r"[A-Za-z0-9_\-]+", position)
        ):
            raise NotFound(self.invalid_cursor_message)
        return cursor
