"""``manage.py weft_resume``: resume a suspended run."""

from __future__ import annotations

from ... import runtime
from ._lifecycle import command

Command = command("resumed", "Resume a suspended run where it waits.", runtime.resume)
