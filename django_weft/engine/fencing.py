"""Commit or be deposed: the one way a turn writes to its run.

Every store method a run's owner calls takes ``(run_id, owner, epoch, ...)`` and raises
:class:`~django_weft.engine.errors.Deposed` (having written nothing) when a newer epoch
owns the run. A turn makes all such writes through :meth:`Fence.write`, so a lost run
always stops the turn the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Concatenate, NoReturn, ParamSpec, TypeVar

from .errors import Deposed

P = ParamSpec("P")
R = TypeVar("R")


class Fence:
    """A turn's fencing token for one run: its owner id and the epoch it claimed.

    ``on_deposed`` is called with the store's ``Deposed`` and must not return: it stops
    driving the run (the context raises its deposed unwinding)."""

    def __init__(
        self, run_id: str, owner: str, epoch: int, on_deposed: Callable[[Deposed], NoReturn]
    ) -> None:
        self.run_id = run_id
        self.owner = owner
        self.epoch = epoch
        self._on_deposed = on_deposed

    def write(
        self, method: Callable[Concatenate[str, str, int, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """Call the fenced store ``method`` for this run, owner and epoch. Raises what
        ``on_deposed`` raises if the run is no longer ours; nothing is then written."""
        try:
            return method(self.run_id, self.owner, self.epoch, *args, **kwargs)
        except Deposed as exc:
            self._on_deposed(exc)
