"""The ports the engine needs from the outside world (implemented by the Django adapter)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Coroutine, Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol

from .errors import UpdateValidationError, WeftError
from .flow import Rate, SlotTaken
from .records import (
    CancelRequest,
    ChildOutcome,
    ChildStart,
    ClaimedRun,
    PendingMessage,
    Renewal,
    StepWrite,
    TimerWrite,
)


class TurnStore(Protocol):
    """Persistence for one engine's turns. Every owner write is fenced on (owner, epoch).

    Methods that take ``owner`` and ``epoch`` raise :class:`~django_weft.engine.errors.Deposed`
    when the run is no longer owned by that owner at that epoch, and then write nothing.
    """

    def claim(
        self, run_id: str, owner: str, ttl: float, grace: float, workflows: Collection[str] | None = None
    ) -> ClaimedRun | None:
        """Claim a runnable run (or take over an expired lease); ``None`` if not claimable.

        With ``workflows``, only a run of one of those workflow names is claimable: an
        engine never takes a run whose code it does not have."""

    def commit_step(self, run_id: str, owner: str, epoch: int, step: StepWrite) -> None:
        """Insert (or replace, for the same seq) one step row, fenced."""

    def commit_step_atomic(
        self, run_id: str, owner: str, epoch: int, body: Callable[[], StepWrite]
    ) -> StepWrite:
        """Run ``body`` inside the fenced transaction that records the step it returns."""

    def park(
        self,
        run_id: str,
        owner: str,
        epoch: int,
        waiting_on: dict[str, object],
        steps: Iterable[StepWrite],
        timers: Iterable[TimerWrite],
    ) -> bool:
        """Record ``steps`` and ``timers``, set the run ``waiting`` and release it, fenced.

        Returns ``True`` when what the run waits for has already happened (a queued
        activity finished while the turn ran): the run is then left runnable instead."""

    def schedule_activity(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, timer: TimerWrite
    ) -> None:
        """Record a queued activity attempt as ``scheduled`` with its dispatch deadline, fenced."""

    def pending_messages(self, run_id: str) -> list[PendingMessage]:
        """The run's unconsumed signals and accepted, unapplied updates, in arrival order."""

    def finish_wait(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, *, signal_pk: int | None = None
    ) -> None:
        """Record a message wait's step (or a signal handler's application), consume the
        signal ``signal_pk`` and remove the timers at the step's position, fenced."""

    def apply_update(self, run_id: str, owner: str, epoch: int, step: StepWrite, update_pk: int) -> None:
        """Record the start of an update's application at ``step.seq``, fenced; the update
        is no longer pending from then on."""

    def answer_update(
        self,
        run_id: str,
        owner: str,
        epoch: int,
        step: StepWrite,
        update_pk: int,
        *,
        ok: bool,
        result_json: str | None,
        error_json: str | None,
    ) -> None:
        """Record an update's outcome on its step and its row, fenced."""

    def fail_update(self, run_id: str, owner: str, epoch: int, update_pk: int, error: dict[str, Any]) -> None:
        """Answer a pending update with ``error`` without applying it, fenced."""

    def deliver_cancel_request(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, delivered: CancelRequest, at: int | None
    ) -> None:
        """Record the cancellation request's history entry ``step``, store ``delivered``
        (the request with the position it was received at) as the run's request, and
        remove the unfired sleep, timeout and retry timers at position ``at``: one fenced
        transaction. The run's park no longer finds the request pending from then on."""

    def cancellation_requested(self, run_id: str, seq: int) -> str | None:
        """Why the activity at ``seq`` should stop (see
        :func:`~django_weft.engine.attempt.cancellation_seen`), or ``None``; one read."""

    def complete(
        self,
        run_id: str,
        owner: str,
        epoch: int,
        result_json: str,
        *,
        parent: str | None = None,
        steps: Sequence[StepWrite] = (),
    ) -> str | None:
        """Commit the run ``completed``, fenced, with ``steps`` (its last steps, held back
        by the turn, in order): all or nothing. For a child (``parent`` given), wake the
        parent if it waits for it and return the parent's id."""

    def fail(
        self,
        run_id: str,
        owner: str,
        epoch: int,
        error_json: str,
        category: str,
        *,
        parent: str | None = None,
    ) -> str | None:
        """Commit the run ``failed``, fenced; like :meth:`complete` for a child."""

    def finish_cancelled(
        self,
        run_id: str,
        owner: str,
        epoch: int,
        error_json: str,
        *,
        workflow_name: str,
        parent: str | None = None,
    ) -> str | None:
        """Commit the run ``cancelled`` from its own turn (the workflow let a cancellation
        propagate), fenced: like an external cancel, its unfired timers are removed, its
        pending updates failed and its finalizer scheduled; like :meth:`complete` for a child."""

    def start_child(self, run_id: str, owner: str, epoch: int, step: StepWrite, child: ChildStart) -> None:
        """Record the child step and create the child run, fenced; ``WorkflowAlreadyExists``
        if a live run has the child's workflow id."""

    def child_outcome(self, run_id: str, seq: int) -> ChildOutcome | None:
        """How the child started at ``seq`` ended; ``None`` while it is live."""

    def close_children(self, run_id: str, reason: str) -> list[str]:
        """Apply the parent-close policy to the live children of a closed run (cancel
        those with "terminate", ask those with "request_cancel" to cancel); return their ids."""

    def hand_on_slot(self, run_id: str, workflow_name: str) -> list[tuple[str, int]]:
        """Run ``run_id`` of a workflow with a concurrency limit ended: let in the queued
        runs its key now has room for; return ``(run id, priority)`` of each, to dispatch."""

    def take_rate_limit(self, name: str, key: str, rate: Rate) -> datetime | None:
        """Take the next moment of the rate limit bucket ``(name, key)``, advanced in one
        statement that every process shares (:func:`~.flow.gcra_take`): ``None`` when the
        attempt may go now, else the moment it may go, which is its own from then on."""

    def take_activity_slot(
        self, activity: str, key: str, limit: int, run_id: str, seq: int, ttl: float, holder: str
    ) -> SlotTaken:
        """Take a slot of ``activity``'s concurrency limit for key ``key`` for the execution
        ``holder`` of the attempt at ``(run_id, seq)``, held ``ttl`` seconds unless renewed:
        free, and no attempt queued before it, or handed on to it. Otherwise queue it
        (keeping its place); while another execution of the same attempt holds the slot
        at its position, it waits without a place."""

    def release_activity_slot(
        self, activity: str, key: str, limit: int, run_id: str, seq: int, ttl: float, holder: str | None
    ) -> list[str]:
        """Give back the slot the execution ``holder`` of the attempt at ``(run_id, seq)``
        holds, or (``None``) the attempt's place in the queue or the slot handed on to it,
        and hand the free slots on to the attempts queued first; return the ids of the runs
        to wake (ring their doorbells)."""

    def renew_activity_slots(self, holders: list[tuple[str, int, str]], ttl: float) -> None:
        """Extend the slots the executions ``(run_id, seq, holder)`` of this process hold
        by ``ttl``."""

    def set_finalizer_state(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, state_json: str
    ) -> None:
        """Record the step and store ``state_json`` as the run's finalizer state, fenced."""

    def set_search_attributes(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, attributes: dict[str, Any]
    ) -> None:
        """Record the step and merge ``attributes`` into the run's search attributes (a
        ``None`` value removes that key) in one fenced transaction: both or neither."""

    def continue_as_new(self, run_id: str, owner: str, epoch: int, args_json: str, kwargs_json: str) -> str:
        """Finish the run as ``continued`` and create its successor; return the new run id."""

    def release(
        self, run_id: str, owner: str, epoch: int, *, redispatch: bool = True, keep_place: bool = False
    ) -> bool:
        """Give up ownership without changing the status; ``False`` if no longer owned.
        ``redispatch=False`` asks the sweep to wait before dispatching the run again;
        ``keep_place=True`` keeps the run's place among the runnable runs (its
        ``ready_at``), for a claim that no turn drove."""

    def renew(self, owner: str, held: dict[str, int], ttl: float) -> Renewal:
        """Extend the leases of ``held`` (run id -> epoch); return the run ids no longer
        held, and those still held whose leases this call did not extend."""

    def db_now(self) -> datetime: ...


class Dispatcher(Protocol):
    """Rings the doorbell for a run: ask some worker to run a turn of it soon.

    Dispatch is only a latency hint. The database holds the pending work and the sweep
    finds it even if every dispatch is lost.
    """

    def dispatch_turn(self, run_id: str, *, eta: datetime | None = None) -> None:
        """Ask a worker to run a turn of ``run_id`` (not before ``eta``). A dispatcher that
        orders its work by priority says so with ``takes_priority = True`` and takes a
        keyword argument ``priority`` (-100..100, higher first)."""

    def dispatch_activity(
        self, run_id: str, seq: int, attempt: int, *, queue: str, timeout: float | None = None
    ) -> None:
        """Ask a worker consuming ``queue`` to run attempt ``attempt`` of the queued activity
        at ``seq``. Lost dispatches are found again through the activity's timer. A
        dispatcher with ``takes_priority = True`` takes a keyword argument ``priority``
        here too: the priority of the attempt's run."""


def ring_turn(dispatcher: Dispatcher, run_id: str, *, eta: datetime | None = None, priority: int = 0) -> None:
    """Ring a run's doorbell with its priority, for a dispatcher that orders by it
    (``takes_priority``); another (a project's own) is called as before."""
    if priority and getattr(dispatcher, "takes_priority", False):
        dispatcher.dispatch_turn(run_id, eta=eta, priority=priority)  # type: ignore[call-arg]
    else:
        dispatcher.dispatch_turn(run_id, eta=eta)


def ring_activity(
    dispatcher: Dispatcher,
    run_id: str,
    seq: int,
    attempt: int,
    *,
    queue: str,
    timeout: float | None = None,
    priority: int = 0,
) -> None:
    """Send an attempt of a queued activity with its run's priority, to a dispatcher that
    orders by it (``takes_priority``); another is called as before."""
    if priority and getattr(dispatcher, "takes_priority", False):
        dispatcher.dispatch_activity(  # type: ignore[call-arg]
            run_id, seq, attempt, queue=queue, timeout=timeout, priority=priority
        )
    else:
        dispatcher.dispatch_activity(run_id, seq, attempt, queue=queue, timeout=timeout)


class Starter(Protocol):
    """Starts a run of the registered workflow ``workflow_name`` and returns its handle:
    what ``Workflow.start`` (the ``.delay``-like shorthand) calls. The Django app sets it
    in ``ready()`` (see :func:`set_starter`), so the engine never imports the client."""

    def __call__(self, workflow_name: str, /, *, args: list[Any], kwargs: dict[str, Any]) -> Any: ...


_starter: Starter | None = None


def set_starter(starter: Starter | None) -> None:
    """Install the :class:`Starter` that ``Workflow.start`` uses (``None`` removes it)."""
    global _starter
    _starter = starter


def get_starter() -> Starter:
    """The installed :class:`Starter`; raises :class:`WeftError` if none is."""
    if _starter is None:
        raise WeftError(
            "no workflow starter is installed, so Workflow.start() cannot start a run. Add "
            '"django_weft" to INSTALLED_APPS and call it after django.setup() (the app installs '
            "the starter in ready()), or install one with django_weft.engine.ports.set_starter()"
        )
    return _starter


class PayloadValidator(Protocol):
    """Checks an update's payload with its handler's validator (a callable, a DRF
    ``Serializer`` class or a pydantic model); raises ``UpdateValidationError``. The
    app installs one in ``ready()`` (see :func:`set_payload_validator`)."""

    def __call__(self, validator: Any, payload: Any, *, what: str) -> None: ...


def _call_only(validator: Any, payload: Any, *, what: str) -> None:
    """Without the app (engine tests): a validator is a callable that raises."""
    try:
        validator(payload)
    except UpdateValidationError:
        raise
    except Exception as exc:
        raise UpdateValidationError(
            f"{what} rejected the payload: {exc}", issues=[{"field": None, "message": str(exc)}]
        ) from None


_payload_validator: PayloadValidator = _call_only


def set_payload_validator(validator: PayloadValidator | None) -> None:
    """Install the :class:`PayloadValidator` the engine uses for updates it validates
    itself (``None`` restores the plain-callable one)."""
    global _payload_validator
    _payload_validator = validator if validator is not None else _call_only


def get_payload_validator() -> PayloadValidator:
    return _payload_validator


CoroutineRunner = Callable[[Coroutine[Any, Any, Any]], Any]
"""Runs an ``async def`` activity's coroutine to its end in a thread that runs no event
loop, and returns its value (or raises its exception)."""


def _asyncio_run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Without the app (engine tests): a loop of its own in this thread."""
    return asyncio.run(coroutine)


_coroutine_runner: CoroutineRunner = _asyncio_run


def set_coroutine_runner(runner: CoroutineRunner | None) -> None:
    """Install the :data:`CoroutineRunner` of async activities (``None`` restores
    ``asyncio.run``). The app installs one in ``ready()`` that keeps Django's async ORM
    calls of the activity in the thread running the attempt."""
    global _coroutine_runner
    _coroutine_runner = runner if runner is not None else _asyncio_run


def get_coroutine_runner() -> CoroutineRunner:
    return _coroutine_runner
