"""Messages to runs: signals, updates (validated, then awaited) and queries (answered by
a read-only replay)."""

from __future__ import annotations

import contextlib
import inspect
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from django.db import transaction

from ..conf import weft_settings
from ..engine import codec, observe, run_logging
from ..engine.context import (
    MAX_MESSAGE_NAME_LENGTH,
    WorkflowContext,
    check_message_name,
    describe_exception,
)
from ..engine.durations import Duration, parse_duration
from ..engine.error_types import ErrorType
from ..engine.errors import (
    ConfigurationError,
    InvalidInput,
    QueryFailed,
    UnknownHandler,
    UpdateFailed,
    UpdateNotFound,
    UpdateTimeout,
    UpdateValidationError,
    WeftError,
    WorkflowNotFound,
    WorkflowTerminalError,
)
from ..engine.parking import handled_updates
from ..engine.records import (
    TERMINAL_STATUSES,
    ClaimedRun,
)
from ..engine.run_logging import get_logger
from ..engine.unwind import Unwind
from ..models import Signal, Update, WorkflowRun
from ..models.messages import UpdateStatus
from ..store.intake import SignalDelivery
from .awaiting import UPDATE_BACKOFF, Found, Pending, await_for, once, wait_for
from .dispatch import delivers, get_dispatcher
from .operations import OPERATIONS, UPDATE_WAIT_DEFAULT, WaitRule
from .process import dispatch_on_commit, get_engine, get_store, sends_notices
from .reading import as_run_id, get_run
from .validation import validate_payload

logger = get_logger("django_weft.runtime")


@dataclass(frozen=True)
class SignalAccepted:
    """The durable acceptance of a signal (the same one again for a repeated ``signal_id``)."""

    run_id: str
    name: str
    signal_id: str | None
    sequence: int
    """The signal's row id: signals to one run are numbered in the order they arrived."""
    received_at: datetime
    duplicate: bool
    """``True`` when ``signal_id`` had been accepted before: nothing new was stored."""


def _message_name(name: Any, what: str) -> str:
    try:
        return check_message_name(name, what)
    except ConfigurationError as exc:
        raise InvalidInput(exc.message) from None


def _message_key(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{what} must be a non-empty string; got {value!r}")
    if len(value) > MAX_MESSAGE_NAME_LENGTH:
        raise InvalidInput(f"{what} is {len(value)} characters long; the limit is {MAX_MESSAGE_NAME_LENGTH}")
    flaw = codec.text_flaw(value)
    if flaw:
        raise InvalidInput(f"{what} must not contain {flaw}")
    return value


def _encode_payload(payload: Any, what: str) -> Any:
    return codec.loads(codec.dumps(payload, what=what, limit=weft_settings.MAX_PAYLOAD_BYTES))


def _accepted(signal: Signal, duplicate: bool) -> SignalAccepted:
    return SignalAccepted(
        run_id=str(signal.run_id),
        name=signal.name,
        signal_id=signal.signal_id,
        sequence=signal.pk,
        received_at=signal.received_at,
        duplicate=duplicate,
    )


def signal(
    ref: str | uuid.UUID, name: str, payload: Any = None, *, signal_id: str | None = None
) -> SignalAccepted:
    """Send signal ``name`` to a run (run id, or workflow id for its latest run).

    Durable on return: the signal is stored, and a run that waits for it or has a
    handler for it is woken. Signals are consumed oldest first, per name. A repeated
    ``signal_id`` (per run and name) stores nothing and returns the first acceptance.
    Raises ``WorkflowNotFound``, ``WorkflowTerminalError`` (the run has finished:
    nothing is stored) or ``InvalidInput`` / ``PayloadError`` for a bad name, id or
    payload (over ``WEFT_MAX_PAYLOAD_BYTES``)."""
    with observe.message_received("signal", name, ref) as seen:
        name = _message_name(name, "signal")
        key = _message_key(signal_id, "signal_id") if signal_id is not None else None
        value = _encode_payload(payload, f"the payload of signal {name}")
        store = get_store()
        delivered = delivers(get_dispatcher())

        def deliver(run_pk: uuid.UUID) -> SignalDelivery:
            # One statement on PostgreSQL, the notice to the workers in it: one round trip.
            try:
                delivery = store.intake.deliver_signal(
                    run_pk,
                    name,
                    value,
                    key,
                    dispatched=delivered,
                    trace_context=observe.start_carrier(),
                    notify=sends_notices(),
                )
            except WorkflowTerminalError as exc:
                seen.run_id, seen.workflow = str(run_pk), getattr(exc, "workflow_name", None)
                raise
            seen.run_id, seen.workflow = str(run_pk), delivery.workflow_name
            return delivery

        run_pk = as_run_id(ref)
        delivery = None
        if run_pk is not None:
            # Most references are run ids: delivered without looking the run up first.
            with contextlib.suppress(WorkflowNotFound):
                delivery = deliver(run_pk)
        if delivery is None:
            # A workflow id (which may look like a run id): its latest run.
            run_pk = get_run(ref).pk
            try:
                delivery = deliver(run_pk)
            except WorkflowTerminalError:
                # It ended between the look-up and the delivery (it continued as new, say):
                # the workflow id's latest run now, once.
                latest = get_run(ref).pk
                if latest == run_pk:
                    raise
                run_pk = latest
                delivery = deliver(run_pk)
        if delivery.woken and delivered:
            dispatch_on_commit(str(run_pk))
        stored = delivery.signal
        if not delivery.duplicate:
            logger.info(
                "run %s: signal %s received (#%s)%s", run_pk, name, stored.pk,
                " and woke it" if delivery.woken else "",
                extra=run_logging.fields_of(run_pk, delivery.workflow_id, delivery.workflow_name),
            )  # fmt: skip
        seen.outcome = "duplicate" if delivery.duplicate else "stored"
        return _accepted(stored, delivery.duplicate)


def _replay(run: WorkflowRun) -> WorkflowContext:
    """The workflow's context at the end of its recorded history (read-only)."""
    store = get_store()
    claimed = ClaimedRun(
        run_id=str(run.pk),
        workflow_id=run.workflow_id,
        workflow_name=run.workflow_name,
        args=list(run.args or []),
        kwargs=dict(run.kwargs or {}),
        epoch=run.owner_epoch,
        attempt=run.attempt,
        created_at=run.created_at,
        db_now=store.db_now(),
        steps=store.sql.load_steps(str(run.pk)),
        search_attributes=dict(run.search_attributes or {}),
    )
    return get_engine().replay_read_only(claimed)


@dataclass(frozen=True)
class HandlerInfo:
    """A message handler a run's workflow registered (``ctx.on_query``, ``ctx.on_update``,
    ``ctx.on_signal``), for a form that offers it by name."""

    kind: str
    """``"query"``, ``"update"`` or ``"signal"``."""
    name: str
    parameters: str
    """The handler's parameters as Python writes them (``"(plus=0)"``, ``"(address)"``);
    ``"(...)"`` for a callable whose signature cannot be read."""

    @property
    def hint(self) -> str:
        return f"{self.name}{self.parameters}"


def registered_handlers(ref: str | uuid.UUID) -> list[HandlerInfo] | None:
    """The handlers a run's workflow has registered at the point its history reached,
    queries first, then updates and signals, each in registration order.

    Handlers are registered by running workflow code, so the names are found as a query
    finds its handler: by a read-only replay of the recorded history (nothing runs or is
    written). ``None`` when the replay cannot say: the workflow is not registered in this
    process, or its code no longer matches the history."""
    run = get_run(ref)
    try:
        ctx = _replay(run)
    except WeftError:  # not registered here, or no longer matching its history
        return None
    found: list[HandlerInfo] = []
    kinds: tuple[tuple[str, dict[str, Any]], ...] = (
        ("query", ctx.query_handlers),
        ("update", {name: entry.handler for name, entry in ctx.update_handlers.items()}),
        ("signal", ctx.signal_handlers),
    )
    for kind, handlers in kinds:
        found.extend(HandlerInfo(kind, name, _parameters(handler)) for name, handler in handlers.items())
    return found


def _parameters(handler: Callable[..., Any]) -> str:
    try:
        return str(inspect.signature(handler))
    except (TypeError, ValueError):  # a builtin or an object without a readable signature
        return "(...)"


def query(ref: str | uuid.UUID, name: str, args: list[Any] | tuple[Any, ...] | None = None) -> Any:
    """Answer query ``name`` of a run: replay its recorded history read-only (no activity
    runs, nothing is written, no lease is taken) and call the handler the workflow
    registered with ``ctx.on_query`` with ``*args``. Works on finished runs too.

    Raises ``UnknownHandler`` (listing the registered names), ``QueryFailed`` when the
    handler raises, ``NonDeterminismError`` when the code no longer matches the history."""
    with observe.message_received("query", name, ref) as seen:
        name = _message_name(name, "query")
        if args is None:
            args = []
        if not isinstance(args, list | tuple):
            raise InvalidInput(f"query args must be a list; got {type(args).__name__}")
        values = _encode_payload(list(args), f"the arguments of query {name}")
        run = get_run(ref)
        seen.run_id, seen.workflow = str(run.pk), run.workflow_name
        ctx = _replay(run)
        handler = ctx.query_handlers.get(name)
        if handler is None:
            raise _unknown_handler("query", name, run, ctx)
        try:
            value = handler(*values)
            answer = codec.roundtrip(value, what=f"the result of query {name}")[0]
            seen.outcome = "answered"
            return answer
        except Unwind:
            raise QueryFailed(
                f"query {name!r} of run {run.pk} called a workflow operation (ctx.run, ctx.now, a wait...); "
                "query handlers may only read the workflow's state",
                run_id=str(run.pk),
                name=name,
            ) from None
        except Exception as exc:
            raise QueryFailed(
                f"query {name!r} of run {run.pk} failed: {type(exc).__name__}: {exc}",
                run_id=str(run.pk),
                name=name,
                error=describe_exception(exc),
            ) from exc


def _unknown_handler(kind: str, name: str, run: WorkflowRun, ctx: WorkflowContext) -> UnknownHandler:
    registered = ctx.registered(kind)
    return UnknownHandler(
        f"workflow {run.workflow_name} (run {run.pk}) has no {kind} handler {name!r} at the point it "
        f"has reached; registered {kind} handlers: {', '.join(registered) or 'none'}",
        kind=kind,
        name=name,
        registered=registered,
        run_id=str(run.pk),
    )


_UPDATE_WAIT = OPERATIONS["update"].wait or WaitRule()


def update(
    ref: str | uuid.UUID,
    name: str,
    payload: Any = None,
    *,
    update_id: str | None = None,
    wait: Duration = UPDATE_WAIT_DEFAULT,
) -> Any:
    """Send update ``name`` to a run and return its handler's result.

    The payload is checked by the handler's validator (found by a read-only replay)
    before anything is stored: a rejection raises ``UpdateValidationError`` with the
    issues. An accepted update is durable; the run applies it at a recorded position
    and the result is returned here within ``wait`` seconds, else ``UpdateTimeout``
    carries the ``update_id`` to poll with :func:`update_result`. A repeated
    ``update_id`` runs nothing new and returns (or waits for) the stored outcome.
    Raises ``UpdateFailed`` when the handler raised, ``WorkflowTerminalError`` for a
    finished run, ``UnknownHandler`` for a name the workflow does not handle."""
    pk, seconds = accept_update(ref, name, payload, update_id=update_id, wait=wait)
    try:
        return wait_for(look_at_update, pk, seconds, UPDATE_BACKOFF)
    except UpdateTimeout as exc:
        if seconds and transaction.get_connection(weft_settings.DATABASE_ALIAS).in_atomic_block:
            # The update commits with the caller's transaction: no worker sees it before.
            raise UpdateTimeout(
                f"{exc} The update was sent inside a transaction (transaction.atomic, or a view "
                "under ATOMIC_REQUESTS): it is stored only when that transaction commits, so no "
                "worker could apply it while this call waited. Send it outside the transaction "
                "(transaction.non_atomic_requests for a view), or with wait=0 and poll "
                "update_result after the commit",
                run_id=exc.run_id,
                update_id=exc.update_id,
            ) from None
        raise


async def aupdate(
    ref: str | uuid.UUID,
    name: str,
    payload: Any = None,
    *,
    update_id: str | None = None,
    wait: Duration = UPDATE_WAIT_DEFAULT,
) -> Any:
    """:func:`update` for a coroutine. The update is validated and stored by one call
    on the caller's sync thread (:func:`~django_weft.runtime.awaiting.once`); waiting
    for its outcome holds no thread and no connection between looks
    (:func:`~django_weft.runtime.awaiting.await_for`)."""
    pk, seconds = await once(accept_update)(ref, name, payload, update_id=update_id, wait=wait)
    return await await_for(look_at_update, pk, seconds, UPDATE_BACKOFF)


def accept_update(
    ref: str | uuid.UUID,
    name: str,
    payload: Any = None,
    *,
    update_id: str | None = None,
    wait: Duration = UPDATE_WAIT_DEFAULT,
) -> tuple[int, float]:
    """The part of :func:`update` before the wait: validate the update and store it
    (a repeated ``update_id`` finds the stored one). Returns the update's row id and the
    wait in seconds."""
    with observe.message_received("update", name, ref) as seen:
        name = _message_name(name, "update")
        key = _message_key(update_id, "update_id") if update_id is not None else uuid.uuid4().hex
        seconds = _UPDATE_WAIT.check(wait)
        value = _encode_payload(payload, f"the payload of update {name}")
        run = get_run(ref)
        try:
            existing = _accept_update_on(run, name, key, value, seen)
        except WorkflowTerminalError:
            # It ended between the look-up and the acceptance (it continued as new, say): the
            # latest run of a workflow id now, once.
            latest = get_run(ref)
            if latest.pk == run.pk:
                raise
            run = latest
            existing = _accept_update_on(run, name, key, value, seen)
        if existing.name != name:
            raise InvalidInput(
                f"update_id {key!r} of run {run.pk} was used for update {existing.name!r}, not {name!r}; "
                "use a new update_id"
            )
        seen.outcome = "accepted"
        return existing.pk, seconds


def _accept_update_on(run: WorkflowRun, name: str, key: str, value: Any, seen: Any) -> Update:
    """Validate the update ``name`` against ``run`` and store it (or find the one stored
    with ``key``); :func:`accept_update`'s part on one run."""
    seen.run_id, seen.workflow = str(run.pk), run.workflow_name
    existing = Update.objects.using(weft_settings.DATABASE_ALIAS).filter(run=run, update_id=key).first()
    if existing is None:
        if run.status in TERMINAL_STATUSES:
            raise _terminal(run, f"update {name!r}")
        ctx = _replay(run)
        entry = ctx.update_handlers.get(name)
        if entry is None and handled_updates(run.waiting_on, run.status) is not None:
            # The run waits at a point where no handler of that name exists.
            raise _unknown_handler("update", name, run, ctx)
        if entry is not None:
            validate_payload(entry.validator, value, what=f"the validator of update {name!r}")
        # else: the run has not got to a blocking point yet (it was started a moment ago,
        # or is running inline steps), so it may still register the handler: store the
        # update, and the run validates and applies it, or rejects it as unknown, when
        # it blocks next.
        store = get_store()
        with transaction.atomic(using=store.alias):
            existing, created, woken = store.intake.accept_update(
                run.pk,
                key,
                name,
                value,
                dispatched=delivers(get_dispatcher()),
                validated=entry is not None,
                trace_context=observe.start_carrier(),
            )
            if woken:
                dispatch_on_commit(str(run.pk))
        if created:
            logger.info(
                "run %s: update %s %s accepted%s", run.pk, name, key, " and woke it" if woken else "",
                extra=run_logging.fields_of(run.pk, run.workflow_id, run.workflow_name),
            )  # fmt: skip
    return existing


def update_result(ref: str | uuid.UUID, update_id: str, *, wait: Duration = 0) -> Any:
    """The outcome of an accepted update: its result, or ``UpdateFailed``; waits up to
    ``wait`` seconds for it, then raises ``UpdateTimeout``."""
    pk, seconds = _stored_update(ref, update_id, wait)
    return wait_for(look_at_update, pk, seconds, UPDATE_BACKOFF)


async def aupdate_result(ref: str | uuid.UUID, update_id: str, *, wait: Duration = 0) -> Any:
    """:func:`update_result` for a coroutine (waits as :func:`aupdate` does)."""
    pk, seconds = await once(_stored_update)(ref, update_id, wait)
    return await await_for(look_at_update, pk, seconds, UPDATE_BACKOFF)


def _stored_update(ref: str | uuid.UUID, update_id: str, wait: Duration) -> tuple[int, float]:
    key = _message_key(update_id, "update_id")
    seconds = parse_duration(wait, what="wait")
    run = get_run(ref)
    pk = (
        Update.objects.using(weft_settings.DATABASE_ALIAS)
        .filter(run=run, update_id=key)
        .values_list("pk", flat=True)
        .first()
    )
    if pk is None:
        raise UpdateNotFound(f"run {run.pk} has no update with update_id {key!r}", run_id=str(run.pk))
    return pk, seconds


def look_at_update(pk: int) -> Found | Pending[int]:
    """One look at an update awaited for its outcome: the handler's result, its error
    (raised), or the row to look at next time (the copy on the run a reset started)."""
    updates = Update.objects.using(weft_settings.DATABASE_ALIAS)
    while True:
        row = (
            updates.filter(pk=pk)
            .values("status", "result", "error", "update_id", "run_id", "name", "run__status")
            .first()
        )
        if row is None:
            raise UpdateNotFound(f"update {pk} no longer exists: its run was purged")
        if row["status"] == UpdateStatus.COMPLETED:
            return Found(row["result"])
        if row["status"] in (UpdateStatus.FAILED, UpdateStatus.REJECTED):
            error = row["error"] or {}
            carried = _carried_by_reset(error, row["update_id"])
            if carried is not None:
                pk = carried  # its run was reset: the new run applies the copy
                continue
            if error.get("type") == ErrorType.UNKNOWN_HANDLER:
                raise UnknownHandler(
                    f"update {row['name']!r} ({row['update_id']}) of run {row['run_id']}: "
                    f"{error.get('message')}",
                    kind="update",
                    name=row["name"],
                    registered=list(error.get("registered") or []),
                )
            if error.get("type") == ErrorType.UPDATE_REJECTED:
                raise UpdateValidationError(str(error.get("message")), issues=list(error.get("issues") or []))
            raise UpdateFailed(
                f"update {row['name']!r} ({row['update_id']}) of run {row['run_id']} failed: "
                f"{error.get('type')}: {error.get('message')}",
                run_id=str(row["run_id"]),
                update_id=row["update_id"],
                error_type=error.get("type"),
                error_message=error.get("message"),
                error_traceback=error.get("traceback"),
            )
        if row["run__status"] in TERMINAL_STATUSES and get_store().intake.fail_abandoned_update(pk):
            continue  # its run finished without answering it: failed now, as the finish would have
        return Pending(pk, partial(_update_timeout, row["name"], str(row["run_id"]), row["update_id"]))


def _update_timeout(name: str, run_id: str, update_id: str, wait: float) -> UpdateTimeout:
    return UpdateTimeout(
        f"update {name!r} of run {run_id} is accepted but not applied yet after {wait} s; "
        f"poll with update_result(..., {update_id!r})",
        run_id=run_id,
        update_id=update_id,
    )


def _carried_by_reset(error: dict[str, Any], update_id: str) -> int | None:
    """The row of the update's copy on the run that replaced its run by a reset, if it was
    pending then (and the copy is still kept)."""
    if error.get("type") != ErrorType.RESET or not error.get("run_id"):
        return None
    try:
        run_id = uuid.UUID(str(error["run_id"]))
    except ValueError:
        return None
    return (
        Update.objects.using(weft_settings.DATABASE_ALIAS)
        .filter(run_id=run_id, update_id=update_id)
        .values_list("pk", flat=True)
        .first()
    )


def _terminal(run: WorkflowRun, what: str) -> WorkflowTerminalError:
    return WorkflowTerminalError(
        f"run {run.pk} ({run.workflow_name} {run.workflow_id}) is {run.status}: a finished run takes no "
        f"{what}; start a new run",
        run_id=str(run.pk),
        workflow_id=run.workflow_id,
        status=run.status,
    )
