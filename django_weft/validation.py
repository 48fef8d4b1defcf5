"""Moved to :mod:`django_weft.runtime.validation`; kept importable for existing imports."""

from __future__ import annotations

from .runtime.validation import Issue, validate_payload

__all__ = ["Issue", "validate_payload"]
