"""What the ``weft`` fixture gives a test: runs driven in the test's own thread and
database, on a virtual clock, with activities that a test may replace.

:class:`WeftTestEnvironment` is also a context manager, for tests written without pytest
(a ``django.test.TestCase``)::

    with WeftTestEnvironment() as weft:
        run = weft.start(fulfil, 42)
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from django.db.models import Min

from ..client import WorkflowHandle, get_handle
from ..client import start as start_run
from ..conf import weft_settings
from ..engine import activity_overrides, clock
from ..engine.durations import Duration, parse_duration
from ..engine.errors import UpdateTimeout
from ..engine.executor import TurnOutcome
from ..engine.records import StepStatus, TimerKind
from ..engine.registry import Activity, registry
from ..models import Schedule, Step, Timer, WorkflowRun
from ..runtime import SignalAccepted, fire_due_schedules, run_activity, run_finalizer
from ..runtime import query as query_run
from ..runtime import signal as signal_run
from ..runtime import update as update_run
from ..runtime.dispatch import SweepOnlyDispatcher, _process_override, use_dispatcher
from ..store import DjangoStore
from .helpers import make_engine

logger = logging.getLogger("django_weft.testing")

_UNSET: Any = object()

RunRef = WorkflowHandle | str | uuid.UUID
"""A run, as a handle, a run id or a workflow id (its latest run)."""


class WeftBusy(RuntimeError):
    """The runs did not become idle: a workflow keeps working without ever waiting, or
    ``advance`` would pass more due times than it steps through."""


class ActivityMock:
    """What :meth:`WeftTestEnvironment.mock_activity` installed for one activity: called
    by each attempt instead of the activity's function. ``calls`` lists the arguments
    of every attempt, as ``(args, kwargs)``."""

    def __init__(self, name: str, return_value: Any, side_effect: Any) -> None:
        self.name = name
        self.return_value = return_value
        self.side_effect = side_effect
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    @property
    def call_count(self) -> int:
        return len(self.calls)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        effect = self.side_effect
        if isinstance(effect, BaseException):
            # A fresh traceback each attempt: the same instance is raised again on a retry.
            raise effect.with_traceback(None)
        if isinstance(effect, type) and issubclass(effect, BaseException):
            raise effect()
        if effect is not None:
            return effect(*args, **kwargs)
        return self.return_value

    def __repr__(self) -> str:
        return f"<ActivityMock {self.name}: {self.call_count} call(s)>"


class WeftTestEnvironment:
    """Runs workflows synchronously in this thread and on this database connection (the
    test's transaction under pytest-django's ``db``), on a :class:`~django_weft.engine.
    clock.VirtualClock` that stands still unless :meth:`advance` moves it.

    While it is active (between ``__enter__`` and ``__exit__``; the fixture does both),
    the virtual clock is the process's, this process's dispatcher rings no doorbells
    (nothing reaches Celery), and :meth:`mock_activity` overrides apply. Leaving undoes
    all three."""

    max_turns = 1000
    """Turns one :meth:`run_until_idle` may run before it gives up (:class:`WeftBusy`)."""
    max_steps = 10_000
    """Due times one :meth:`advance` may stop at before it gives up (:class:`WeftBusy`)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.clock = clock.VirtualClock(start)
        self.engine = make_engine(engine_id=f"weft-test:{os.getpid()}:{uuid.uuid4().hex[:8]}")
        self._store = DjangoStore()
        self._mocks: dict[str, ActivityMock] = {}
        self._dispatchers: list[Any] = []

    # -- activation -------------------------------------------------------------------------

    def __enter__(self) -> WeftTestEnvironment:
        clock.install(self.clock)
        self._dispatchers = list(_process_override)
        use_dispatcher(SweepOnlyDispatcher())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for name in self._mocks:
            activity_overrides.remove(name)
        self._mocks.clear()
        use_dispatcher(self._dispatchers[0] if self._dispatchers else None)
        clock.uninstall(self.clock)

    # -- time -------------------------------------------------------------------------------

    def now(self) -> datetime:
        """The virtual clock's time (UTC): what ``ctx.now()`` returns in a turn run now."""
        return self.clock.now()

    def advance(self, duration: Duration) -> datetime:
        """Let ``duration`` (``"3d"``, seconds, a ``timedelta``) pass, as a deployment would
        live through it: the clock stops at each due time on the way (timers, retries,
        execution timeouts, schedules, expired leases) and runs the turns that wakes,
        so a run that sleeps twice within the span wakes twice, each at its time; then
        the clock is set to the end of the span. Returns the new time."""
        seconds = parse_duration(duration, what="advance()")
        target = self.clock.now() + timedelta(seconds=seconds)
        self.run_until_idle()
        for _ in range(self.max_steps):
            due = self._next_due_time()
            if due is None or due > target:
                self.clock.advance_to(target)
                self.run_until_idle()
                return self.clock.now()
            self.clock.advance_to(due)
            self.run_until_idle()
        raise WeftBusy(
            f"advance({duration!r}) stopped at {self.max_steps} due times on the way and is at "
            f"{self.clock.now().isoformat()}; advance in smaller spans (a schedule that fires every "
            "second, say, passes 86,400 due times a day)"
        )

    def _next_due_time(self) -> datetime | None:
        """The earliest moment after now at which something comes due."""
        now = self.clock.now()
        alias = weft_settings.DATABASE_ALIAS
        grace = timedelta(seconds=weft_settings.TAKEOVER_GRACE)
        times = [
            Timer.objects.using(alias)
            .filter(fired_at__isnull=True, fire_at__gt=now)
            .aggregate(due=Min("fire_at"))["due"],
            Schedule.objects.using(alias)
            .filter(paused=False, next_fire_at__gt=now)
            .aggregate(due=Min("next_fire_at"))["due"],
        ]
        lease = (
            WorkflowRun.objects.using(alias)
            .filter(owner_id__isnull=False, lease_expires_at__gte=now - grace)
            .aggregate(due=Min("lease_expires_at"))["due"]
        )
        if lease is not None:
            # A lease is taken over once it expired *more* than the grace period ago.
            times.append(lease + grace + timedelta(microseconds=1))
        found = [moment for moment in times if moment is not None]
        return min(found) if found else None

    # -- running ----------------------------------------------------------------------------

    def run_until_idle(self) -> None:
        """Do everything that is due at the current virtual time, until nothing is: fire
        due timers and schedules, run the turns of runnable runs (and take over runs
        whose lease expired), queued activity attempts and finalizers, in this thread.
        Retention is left out: finished runs stay however far the clock moves
        (``runtime.purge_expired()`` purges on the virtual clock when called)."""
        turns = 0
        while True:
            progressed = self._sweep()
            for run_id in self._runs_to_drive():
                outcome = self.engine.run_turn(run_id)
                if outcome == TurnOutcome.RELEASED:
                    name = self._runs().filter(pk=run_id).values_list("workflow_name", flat=True).first()
                    raise LookupError(
                        f"run {run_id} is a run of workflow {name!r}, which is not registered in this "
                        "process: import the module that defines it (or install its app)"
                    )
                if outcome != TurnOutcome.NOT_CLAIMED:
                    progressed = True
                    turns += 1
            for run_id, seq, attempt in self._queued_attempts():
                run_activity(run_id, seq, attempt)
                progressed = True
            if not progressed:
                return
            if turns > self.max_turns:
                raise WeftBusy(
                    f"run_until_idle() ran {turns} turns and the runs are still busy at "
                    f"{self.clock.now().isoformat()}: a workflow that never waits (a loop of "
                    "continue_as_new, a child that restarts itself)?"
                )

    def _sweep(self) -> bool:
        """What ``tick`` does with what is due (without retention, and running the
        finalizer attempts here); whether anything was."""
        store, batch = self._store, weft_settings.TICK_BATCH
        progressed = False
        # Finalizer timers are the finalizers' (claimed below), as in the sweep.
        due = Timer.objects.using(store.alias).due(self.clock.now()).exclude(kind=TimerKind.FINALIZER)
        for _ in range(self.max_turns):
            # Each call fires every due timer of up to ``batch`` runs, woken or not.
            if not due.exists():
                break
            store.sweep.fire_due_timers(batch)
            progressed = True
        progressed = bool(fire_due_schedules(batch)) or progressed
        progressed = bool(store.sweep.close_orphaned_children(batch)) or progressed
        progressed = bool(store.sweep.wake_waiting_parents(batch)) or progressed
        for run_id, attempt in store.finalizers.claim_due_finalizers(batch, weft_settings.REDISPATCH_AFTER):
            run_finalizer(run_id, attempt)
            progressed = True
        return progressed

    def _runs(self) -> Any:
        return WorkflowRun.objects.using(weft_settings.DATABASE_ALIAS)

    def _runs_to_drive(self) -> list[str]:
        """Runnable runs, then owned runs whose lease expired past the grace period."""
        runnable = list(self._runs().runnable().order_by("ready_at", "pk").values_list("pk", flat=True))
        expired = list(
            self._runs()
            .expired_leases(self.clock.now(), weft_settings.TAKEOVER_GRACE)
            .order_by("lease_expires_at", "pk")
            .values_list("pk", flat=True)
        )
        return [str(pk) for pk in runnable + expired]

    def _queued_attempts(self) -> list[tuple[str, int, int]]:
        rows = (
            Step.objects.using(weft_settings.DATABASE_ALIAS)
            .filter(status=StepStatus.SCHEDULED)
            .order_by("run_id", "seq")
            .values_list("run_id", "seq", "attempt")
        )
        return [(str(run_id), seq, attempt) for run_id, seq, attempt in rows]

    # -- runs -------------------------------------------------------------------------------

    def start(self, workflow: Any, /, *args: Any, id: str | None = None, **kwargs: Any) -> WorkflowHandle:
        """Start ``workflow`` (a ``@workflow`` object or a registered name) with ``args``
        and ``kwargs`` under workflow id ``id`` (default: the run id), then
        :meth:`run_until_idle`. Returns the run's handle. For the other start options
        (``execution_timeout``, ``start_delay``...) call ``client.start`` and then
        :meth:`run_until_idle`."""
        handle = start_run(workflow, args=list(args), kwargs=kwargs, id=id)
        self.run_until_idle()
        return handle

    def signal(self, run: RunRef, name: str, payload: Any = None) -> SignalAccepted:
        """Send signal ``name`` to ``run``, then :meth:`run_until_idle`."""
        accepted = signal_run(_ref(run), name, payload)
        self.run_until_idle()
        return accepted

    def update(self, run: RunRef, name: str, payload: Any = None) -> Any:
        """Send update ``name`` to ``run``, :meth:`run_until_idle`, and return the
        handler's result. Raises what ``handle.update`` raises (``UpdateValidationError``
        before anything is stored, ``UpdateFailed``, ``UnknownHandler``...), and
        ``UpdateTimeout`` if the runs went idle without applying it."""
        ref = _ref(run)
        update_id = uuid.uuid4().hex
        try:
            return update_run(ref, name, payload, update_id=update_id, wait=0)
        except UpdateTimeout:
            pass  # accepted; the run applies it in the turns below
        self.run_until_idle()
        return get_handle(ref).update_result(update_id)

    def query(self, run: RunRef, name: str, *args: Any) -> Any:
        """Call query handler ``name`` of ``run`` with ``args`` (a read-only replay)."""
        return query_run(_ref(run), name, list(args))

    def history(self, run: RunRef) -> list[dict[str, Any]]:
        """``run``'s history entries as dicts, in order (``handle.history()``)."""
        return get_handle(_ref(run)).history()

    # -- activities -------------------------------------------------------------------------

    def mock_activity(
        self,
        activity: Activity[..., Any] | str | Any,
        *,
        return_value: Any = _UNSET,
        side_effect: Callable[..., Any] | BaseException | type[BaseException] | None = None,
    ) -> ActivityMock:
        """Replace what ``activity`` (an ``@activity`` object, its registered name, or a
        task of Django's task framework run by ``WeftTaskBackend``) does,
        for the rest of this test: each attempt returns ``return_value``, or calls
        ``side_effect`` with the activity's arguments and returns what it returns, or
        raises ``side_effect`` if it is an exception (an instance or a class), which
        fails the attempt as the activity's own exception would: its retry policy
        applies. Attempts are recorded in the history like real ones, so replay returns
        their results. Returns the :class:`ActivityMock`, whose ``calls`` list the
        arguments it was called with."""
        name = _activity_name(activity)
        if return_value is not _UNSET and side_effect is not None:
            raise TypeError(f"mock_activity({name!r}): give return_value or side_effect, not both")
        if side_effect is not None and not (callable(side_effect) or isinstance(side_effect, BaseException)):
            raise TypeError(
                f"mock_activity({name!r}): side_effect must be a callable or an exception; "
                f"got {type(side_effect).__name__}"
            )
        mock = ActivityMock(name, None if return_value is _UNSET else return_value, side_effect)
        self._mocks[name] = mock
        activity_overrides.override(name, mock)
        return mock


def _ref(run: RunRef) -> str:
    return str(run.run_id) if isinstance(run, WorkflowHandle) else str(run)


def _activity_name(activity: Activity[..., Any] | str) -> str:
    if isinstance(activity, Activity):
        return activity.name
    module_path = getattr(activity, "module_path", None)
    if isinstance(module_path, str) and callable(getattr(activity, "func", None)):
        return module_path  # a task of Django's task framework: its activity's name
    if not isinstance(activity, str):
        raise TypeError(
            f"mock_activity() takes an @activity object or an activity's registered name; got {activity!r}"
        )
    if activity not in registry.activities:
        known = ", ".join(sorted(registry.activities)) or "none"
        raise LookupError(f"no activity named {activity!r} is registered; registered activities: {known}")
    return activity
