"""``manage.py weft_retry``: reactivate a failed run from its failed step."""

from __future__ import annotations

from ... import runtime
from ._lifecycle import command

Command = command("retried", "Reactivate a failed run: its failed step is attempted afresh.", runtime.retry)
