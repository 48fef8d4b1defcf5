"""Commit or be deposed: the one way a turn writes to its run.

Every store method a run's owner calls takes ``(run_id, owner, epoch, ...)`` and raises
:class:`~django_weft.engine.errors.Deposed` (having written nothing) when a newer epoch
owns the run. A turn makes all such writes through :meth:`Fence.write`, so a lost run
always stops the turn the same way.

A step may be held back (:meth:`Fence.hold`): an inline activity's completed step is
written with the turn's next write, or folded into the run's terminal commit when the
workflow returns right after it (one statement, one commit instead of two). The context
writes a held step before the next activity starts, so an activity's result is always
recorded before the next activity runs (docs/explanation/guarantees.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Concatenate, NoReturn, ParamSpec, TypeVar

from .errors import Deposed
from .records import StepWrite

P = ParamSpec("P")
R = TypeVar("R")


class Fence:
    """A turn's fencing token for one run: its owner id and the epoch it claimed.

    ``on_deposed`` is called with the store's ``Deposed`` and must not return: it stops
    driving the run (the context raises its deposed unwinding)."""

    def __init__(
        self,
        run_id: str,
        owner: str,
        epoch: int,
        on_deposed: Callable[[Deposed], NoReturn],
        commit_step: Callable[[str, str, int, StepWrite], None] | None = None,
        on_written: Callable[[StepWrite], None] | None = None,
    ) -> None:
        self.run_id = run_id
        self.owner = owner
        self.epoch = epoch
        self._on_deposed = on_deposed
        self._commit_step = commit_step
        self._on_written = on_written
        self._held: StepWrite | None = None

    def write(
        self, method: Callable[Concatenate[str, str, int, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """Call the fenced store ``method`` for this run, owner and epoch, after the step
        held back if there is one. Raises what ``on_deposed`` raises if the run is no
        longer ours; nothing is then written."""
        self.flush()
        try:
            return method(self.run_id, self.owner, self.epoch, *args, **kwargs)
        except Deposed as exc:
            self._on_deposed(exc)

    def hold(self, step: StepWrite) -> None:
        """Write ``step`` with the next write (or :meth:`take_held` folds it into the
        terminal commit) instead of now."""
        assert self._commit_step is not None, "this fence has no step commit to hold for"
        self.flush()
        self._held = step

    def flush(self) -> None:
        """Write the step held back, if any, on its own."""
        step, self._held = self._held, None
        if step is None:
            return
        assert self._commit_step is not None
        try:
            self._commit_step(self.run_id, self.owner, self.epoch, step)
        except Deposed as exc:
            self._on_deposed(exc)
        if self._on_written is not None:
            self._on_written(step)

    def take_held(self) -> StepWrite | None:
        """The step held back, for the terminal commit to write; it is no longer held."""
        step, self._held = self._held, None
        return step
