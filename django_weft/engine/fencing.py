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

A step that *rides* (a sleep's end) may stay held past the next operations, until a step
that does not ride is written or the run's terminal commit: nothing the workflow does
next depends on its record, and a turn that stops before writing it replays the sleep,
which ends again at once. So a sleep followed by an activity and the workflow's return
is recorded by the completion's one statement, with the activity's result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Concatenate, NoReturn, ParamSpec, TypeVar

from .errors import Deposed
from .records import StepWrite

MAX_HELD = 8
"""Steps held at most (a workflow ending many due sleeps in a row writes them in groups):
the terminal commit writes the held steps in its own statement, one part each."""

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
        # In order: steps that ride, then at most one that does not (the last).
        self._held: list[StepWrite] = []
        self._riding = True

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

    def hold(self, step: StepWrite, *, rides: bool = False) -> None:
        """Write ``step`` with the next write (or :meth:`take_held` folds it into the
        terminal commit) instead of now. ``rides``: it may stay held past the next
        operations too (:meth:`flush` with ``keep_riding``), up to :data:`MAX_HELD`
        steps."""
        assert self._commit_step is not None, "this fence has no step commit to hold for"
        if not self._riding or len(self._held) >= MAX_HELD:
            self.flush()
        self._held.append(step)
        self._riding = rides

    def flush(self, *, keep_riding: bool = False) -> None:
        """Write the steps held back, if any, each on its own, in order. ``keep_riding``:
        unless one of them does not ride, they stay held (the workflow goes on). A step
        is let go once written: one the database failed to write stays held, with those
        after it."""
        if not self._held or (keep_riding and self._riding):
            return
        assert self._commit_step is not None
        while self._held:
            step = self._held[0]
            try:
                self._commit_step(self.run_id, self.owner, self.epoch, step)
            except Deposed as exc:
                self._on_deposed(exc)
            del self._held[0]
            if self._on_written is not None:
                self._on_written(step)
        self._riding = True

    def take_held(self) -> list[StepWrite]:
        """The steps held back, in order, for the terminal commit to write; they are no
        longer held."""
        steps, self._held, self._riding = self._held, [], True
        return steps
