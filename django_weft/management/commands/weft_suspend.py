"""``manage.py weft_suspend``: suspend a running or waiting run."""

from __future__ import annotations

from ... import runtime
from ._lifecycle import command

Command = command("suspended", "Suspend a running or waiting run until weft_resume.", runtime.suspend)
