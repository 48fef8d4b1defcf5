"""Argument types the ``weft_*`` commands share."""

from __future__ import annotations

import argparse
import logging
import math

LARGEST = 2**31 - 1
"""The largest count a command takes: a 32-bit integer, which every database's LIMIT holds."""

LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


def positive(text: str) -> int:
    """An ``argparse`` type: an integer from 1 to :data:`LARGEST`, or a message saying so."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= LARGEST:
        raise argparse.ArgumentTypeError(f"must be a positive integer up to {LARGEST}; got {text[:100]!r}")
    return value


def seconds(text: str) -> float:
    """An ``argparse`` type: a finite number of seconds, at least 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, at least 0; got {text[:100]!r}")
    return value


def log_level(text: str) -> str:
    """An ``argparse`` type: a logging level's name, in any case."""
    level = text.upper()
    if level not in LOG_LEVELS or not isinstance(logging.getLevelName(level), int):
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(LOG_LEVELS)}; got {text[:100]!r}")
    return level
