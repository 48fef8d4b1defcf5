"""The internal control-flow exceptions that unwind a workflow function mid-turn.

They derive from ``BaseException``, so ``except Exception`` in workflow code cannot
swallow them; the executor reads the one the context raised (``ctx._unwinding``) and
acts on it even if the code caught it.
"""

from __future__ import annotations

from typing import Any

from . import codec
from .errors import Deposed
from .records import StepWrite, TimerWrite


class Unwind(BaseException):
    """Unwinds the workflow function. Derives from BaseException so ``except Exception``
    in workflow code cannot swallow it."""


class Park(Unwind):
    """The run cannot continue now: record what it waits for and release it."""

    def __init__(self, waiting_on: dict[str, Any], steps: list[StepWrite], timers: list[TimerWrite]) -> None:
        super().__init__(waiting_on.get("kind", "wait"))
        self.waiting_on = waiting_on
        self.steps = steps
        self.timers = timers


class DeposedUnwind(Unwind):
    """This engine lost the run mid-turn: stop executing workflow code at once.

    A BaseException, so ``except Exception`` in workflow code (a saga's compensation
    branch, say) cannot keep a deposed engine running activities."""

    def __init__(self, cause: Deposed) -> None:
        super().__init__(str(cause))
        self.cause = cause


class QueryFrontier(Unwind):
    """A read-only replay (a query, an update's validation) reached the end of the
    recorded history: the workflow's state is what the query sees."""


class ContinueAsNew(Unwind):
    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__("continue_as_new")
        self.args_json = codec.dumps(list(args), what="continue_as_new arguments")
        self.kwargs_json = codec.dumps(kwargs, what="continue_as_new keyword arguments")
