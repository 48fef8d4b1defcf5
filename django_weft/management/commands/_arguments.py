"""Argument types the ``weft_*`` commands share."""

from __future__ import annotations

import argparse


def positive(text: str) -> int:
    """An ``argparse`` type: an integer of at least 1, or a message saying so."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text!r}")
    return value
