"""The one service path: start, run a turn, tick, inspect.

The Python client, management commands, Celery tasks, admin actions and API views all
call these functions; no other module writes run, step or timer rows.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, Min
from django.db.models.functions import Now

from . import signals
from .conf import weft_settings
from .dispatch import delivers, get_dispatcher
from .engine import codec, faults
from .engine.context import (
    MAX_MESSAGE_NAME_LENGTH,
    ActivityInfo,
    WorkflowContext,
    _current_activity,
    _Unwind,
    check_message_name,
    describe_exception,
)
from .engine.durations import Duration, parse_duration
from .engine.errors import (
    ConfigurationError,
    InvalidInput,
    PayloadError,
    QueryFailed,
    ResultTimeout,
    UnknownHandler,
    UpdateFailed,
    UpdateNotFound,
    UpdateTimeout,
    WorkflowAlreadyExists,
    WorkflowCancelled,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowTerminalError,
    WorkflowTimedOut,
)
from .engine.executor import Engine, TurnOutcome
from .engine.records import (
    FINALIZER_SEQ,
    RUN_LEVEL_SEQ,
    TERMINAL_STATUSES,
    ClaimedRun,
    RunStatus,
    StepStatus,
    TimerKind,
)
from .engine.registry import Activity, registry
from .models import Signal, Step, Timer, Update, WorkflowRun
from .models.messages import UpdateStatus
from .models.runs import WORKFLOW_ID_MAX_LENGTH
from .store import DjangoStore
from .validation import validate_payload

logger = logging.getLogger("django_weft.runtime")

ON_CONFLICT_CHOICES = ("use_existing", "fail", "start_new_if_terminal")


class _CurrentDispatcher:
    """Resolves the dispatcher at each call, so settings and overrides apply live."""

    def dispatch_turn(self, run_id: str, *, eta: datetime | None = None) -> None:
        get_dispatcher().dispatch_turn(run_id, eta=eta)

    def dispatch_activity(
        self, run_id: str, seq: int, attempt: int, *, queue: str, timeout: float | None = None
    ) -> None:
        get_dispatcher().dispatch_activity(run_id, seq, attempt, queue=queue, timeout=timeout)


_engine_lock = threading.Lock()
_engine: Engine | None = None
_engine_pid = 0


def get_store() -> DjangoStore:
    return DjangoStore()


def get_engine() -> Engine:
    """This process's engine (one engine id per process; a forked child gets its own)."""
    global _engine, _engine_pid
    with _engine_lock:
        if _engine is None or _engine_pid != os.getpid():
            _engine = Engine(get_store(), _CurrentDispatcher(), weft_settings.engine_config)
            _engine_pid = os.getpid()
        return _engine


def _dispatch_on_commit(run_id: str, *, eta: datetime | None = None) -> None:
    dispatcher = get_dispatcher()
    if delivers(dispatcher):
        alias = weft_settings.DATABASE_ALIAS
        transaction.on_commit(lambda: dispatcher.dispatch_turn(run_id, eta=eta), using=alias)


# -- start -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StartResult:
    run_id: str
    workflow_id: str
    created: bool


def _validate_workflow_id(workflow_id: Any) -> str:
    if not isinstance(workflow_id, str):
        raise InvalidInput(f"id must be a string; got {type(workflow_id).__name__}")
    if not workflow_id.strip():
        raise InvalidInput("id must not be empty or blank; omit it to get a generated id")
    if len(workflow_id) > WORKFLOW_ID_MAX_LENGTH:
        raise InvalidInput(f"id is {len(workflow_id)} characters long; the limit is {WORKFLOW_ID_MAX_LENGTH}")
    if any(ord(ch) < 32 for ch in workflow_id):
        raise InvalidInput("id must not contain control characters")
    return workflow_id


@dataclass(frozen=True)
class _StartSpec:
    """A start request, validated and encoded: nothing is written until it is whole."""

    definition: Any
    fields: dict[str, Any]
    workflow_id: str | None
    on_conflict: str
    timeout: float | None
    delay: float | None


def _prepare_start(
    workflow: str,
    args: list[Any] | tuple[Any, ...] | None,
    kwargs: dict[str, Any] | None,
    *,
    id: str | None,
    on_conflict: str,
    execution_timeout: Duration | None,
    start_delay: Duration | None,
    search_attributes: dict[str, Any] | None,
) -> _StartSpec:
    definition = registry.get_workflow(workflow)
    if args is None:
        args = []
    if not isinstance(args, list | tuple):
        raise InvalidInput(f"args must be a list; got {type(args).__name__}")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict) or not all(isinstance(key, str) for key in kwargs):
        raise InvalidInput("kwargs must be a dict with string keys")
    limit = weft_settings.MAX_PAYLOAD_BYTES
    args_value = codec.loads(codec.dumps(list(args), what="args", limit=limit))
    kwargs_value = codec.loads(codec.dumps(kwargs, what="kwargs", limit=limit))
    if search_attributes is None:
        search_attributes = {}
    if not isinstance(search_attributes, dict):
        raise InvalidInput("search_attributes must be a dict")
    attributes = codec.loads(codec.dumps(search_attributes, what="search_attributes", limit=limit))
    if on_conflict not in ON_CONFLICT_CHOICES:
        raise InvalidInput(
            f"on_conflict must be one of {', '.join(ON_CONFLICT_CHOICES)}; got {on_conflict!r}"
        )
    timeout = (
        parse_duration(execution_timeout, what="execution_timeout") if execution_timeout is not None else None
    )
    delay = parse_duration(start_delay, what="start_delay") if start_delay is not None else None
    return _StartSpec(
        definition=definition,
        fields={
            "workflow_name": definition.name,
            "workflow_version": definition.version,
            "args": args_value,
            "kwargs": kwargs_value,
            "search_attributes": attributes,
        },
        workflow_id=_validate_workflow_id(id) if id is not None else None,
        on_conflict=on_conflict,
        timeout=timeout,
        delay=delay,
    )


def start(
    workflow: str,
    args: list[Any] | tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    id: str | None = None,
    on_conflict: str = "use_existing",
    execution_timeout: Duration | None = None,
    start_delay: Duration | None = None,
    search_attributes: dict[str, Any] | None = None,
) -> StartResult:
    """Create a run of ``workflow``, unowned and runnable (or ``pending`` with a delay).

    Everything is validated before anything is written. Idempotent by ``id``:
    ``use_existing`` (default) returns the latest run with that id if there is one,
    ``fail`` raises :class:`WorkflowAlreadyExists`, ``start_new_if_terminal`` returns a
    live run with that id or starts a new one when the latest has finished.
    """
    spec = _prepare_start(
        workflow,
        args,
        kwargs,
        id=id,
        on_conflict=on_conflict,
        execution_timeout=execution_timeout,
        start_delay=start_delay,
        search_attributes=search_attributes,
    )
    store = get_store()
    run_id = uuid.uuid4()
    if spec.workflow_id is None and spec.delay is None and spec.timeout is None:
        # Nothing to look up, nothing to compute from the database clock: one INSERT in
        # autocommit (the run's new id cannot conflict), then the doorbell.
        dispatched = delivers(get_dispatcher())
        WorkflowRun.objects.using(store.alias).create(
            id=run_id,
            workflow_id=str(run_id),
            status=RunStatus.RUNNING,
            ready_at=Now(),
            dispatched_at=Now() if dispatched else None,
            **spec.fields,
        )
        _dispatch_on_commit(str(run_id))
        store._announce(signals.run_started, run_id, str(run_id), spec.definition.name)
        logger.info("run %s (%s %s): started", run_id, spec.definition.name, run_id)
        return StartResult(str(run_id), str(run_id), created=True)
    for attempt in range(3):
        try:
            with transaction.atomic(using=store.alias):
                if spec.workflow_id is not None:
                    existing = _existing_for_start(store, spec.workflow_id, spec.on_conflict)
                    if existing is not None:
                        return StartResult(str(existing.pk), existing.workflow_id, created=False)
                run = _create_run(store, spec, run_id)
            logger.info("run %s (%s %s): started", run.pk, run.workflow_name, run.workflow_id)
            return StartResult(str(run.pk), run.workflow_id, created=True)
        except IntegrityError:
            # A concurrent start with the same id won the one-active-run constraint
            # (only reachable where the advisory lock is unavailable); look again.
            if spec.workflow_id is None or attempt == 2:
                raise
    raise AssertionError("unreachable")


def _create_run(store: DjangoStore, spec: _StartSpec, run_id: uuid.UUID) -> WorkflowRun:
    """Insert the run (and its delayed-start timer); ring its doorbell on commit. Runs
    inside the caller's transaction."""
    now = store.db_now()
    delay, timeout = spec.delay, spec.timeout
    # A run whose doorbell is rung on commit counts as dispatched, so the sweep does not
    # send a second message before a worker had the chance to claim it.
    dispatched_at = now if delivers(get_dispatcher()) and not delay else None
    run = WorkflowRun.objects.using(store.alias).create(
        id=run_id,
        workflow_id=spec.workflow_id or str(run_id),
        status=RunStatus.PENDING if delay else RunStatus.RUNNING,
        ready_at=None if delay else now,
        dispatched_at=dispatched_at,
        execution_deadline=now + timedelta(seconds=timeout) if timeout is not None else None,
        **spec.fields,
    )
    if run.execution_deadline is not None:
        # The deadline is a timer: the sweep times the run out when it fires.
        Timer.objects.using(store.alias).create(
            run=run, seq=RUN_LEVEL_SEQ, kind=TimerKind.DEADLINE, fire_at=run.execution_deadline
        )
    if delay:
        fire_at = now + timedelta(seconds=delay)
        Timer.objects.using(store.alias).create(
            run=run, seq=RUN_LEVEL_SEQ, kind=TimerKind.DELAYED_START, fire_at=fire_at
        )
        _dispatch_on_commit(str(run.pk), eta=fire_at)
    else:
        _dispatch_on_commit(str(run.pk))
    store._announce(signals.run_started, run.pk, run.workflow_id, run.workflow_name)
    return run


def _existing_for_start(store: DjangoStore, workflow_id: str, on_conflict: str) -> WorkflowRun | None:
    if store.is_postgres:
        # Serialise starts of one business key, so "look, then create" cannot interleave.
        with store.connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 7321))", [workflow_id])
    runs = WorkflowRun.objects.using(store.alias).for_workflow_id(workflow_id)
    # The live run if there is one (at most one exists), else the newest finished one.
    latest = runs.active().first() or runs.first()
    if latest is None:
        return None
    if on_conflict == "fail":
        raise WorkflowAlreadyExists(
            f"a run with workflow id {workflow_id!r} already exists (run {latest.pk}, {latest.status}); "
            "pass on_conflict='use_existing' to get it back or 'start_new_if_terminal'",
            workflow_id=workflow_id,
            run_id=str(latest.pk),
        )
    if on_conflict == "start_new_if_terminal" and latest.status in TERMINAL_STATUSES:
        return None
    return latest


# -- messages: signals, updates, queries ------------------------------------------------


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
    if any(ord(ch) < 32 for ch in value):
        raise InvalidInput(f"{what} must not contain control characters")
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
    name = _message_name(name, "signal")
    key = _message_key(signal_id, "signal_id") if signal_id is not None else None
    value = _encode_payload(payload, f"the payload of signal {name}")
    run = get_run(ref)
    store = get_store()
    with transaction.atomic(using=store.alias):
        stored, duplicate, woken = store.deliver_signal(
            run.pk, name, value, key, dispatched=delivers(get_dispatcher())
        )
        if woken:
            _dispatch_on_commit(str(run.pk))
    if not duplicate:
        logger.info(
            "run %s: signal %s received (#%s)%s", run.pk, name, stored.pk, " and woke it" if woken else ""
        )
    return _accepted(stored, duplicate)


@dataclass(frozen=True)
class SignalWithStartResult:
    run_id: str
    workflow_id: str
    created: bool
    """``True`` when a new run was started for the signal."""
    signal: SignalAccepted


def signal_with_start(
    workflow: str,
    args: list[Any] | tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    id: str,
    signal: str,
    payload: Any = None,
    signal_id: str | None = None,
    execution_timeout: Duration | None = None,
    search_attributes: dict[str, Any] | None = None,
) -> SignalWithStartResult:
    """Signal the live run with workflow id ``id``, or start one and signal it: in one
    transaction either way, so the signal is never lost between the two and two callers
    with the same ``id`` end up with one run. The arguments are those of :func:`start`
    and :func:`signal`; they apply only when a run is started."""
    if id is None:
        raise InvalidInput("signal_with_start needs id=...: the workflow id that finds the run to signal")
    spec = _prepare_start(
        workflow,
        args,
        kwargs,
        id=id,
        on_conflict="start_new_if_terminal",
        execution_timeout=execution_timeout,
        start_delay=None,
        search_attributes=search_attributes,
    )
    name = _message_name(signal, "signal")
    key = _message_key(signal_id, "signal_id") if signal_id is not None else None
    value = _encode_payload(payload, f"the payload of signal {name}")
    store = get_store()
    assert spec.workflow_id is not None
    dispatched = delivers(get_dispatcher())
    for attempt in range(3):
        try:
            with transaction.atomic(using=store.alias):
                outcome = _signal_or_start(store, spec, name, value, key, dispatched)
        except IntegrityError:
            # A concurrent start won the one-active-run constraint (only reachable where
            # the advisory lock is unavailable): look again.
            if attempt == 2:
                raise
            continue
        logger.info(
            "run %s (%s): signal %s %s", outcome.run_id, outcome.workflow_id, name,
            "with a new run" if outcome.created else "received",
        )  # fmt: skip
        return outcome
    raise AssertionError("unreachable")


def _signal_or_start(
    store: DjangoStore, spec: _StartSpec, name: str, value: Any, key: str | None, dispatched: bool
) -> SignalWithStartResult:
    assert spec.workflow_id is not None
    # The advisory lock of starts by id serialises concurrent signal_with_starts.
    run = _existing_for_start(store, spec.workflow_id, spec.on_conflict)
    if run is not None:
        try:
            stored, duplicate, woken = store.deliver_signal(run.pk, name, value, key, dispatched=dispatched)
        except WorkflowTerminalError:
            # It finished between the look-up and deliver_signal's row lock; nothing was
            # written, so a new run takes its place.
            run = None
    created = run is None
    if run is None:
        run = _create_run(store, spec, uuid.uuid4())
        stored, duplicate, woken = store.deliver_signal(run.pk, name, value, key, dispatched=dispatched)
    if woken:
        _dispatch_on_commit(str(run.pk))
    return SignalWithStartResult(str(run.pk), run.workflow_id, created, _accepted(stored, duplicate))


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
        steps=store.load_steps(str(run.pk)),
    )
    return get_engine().replay_read_only(claimed)


def query(ref: str | uuid.UUID, name: str, args: list[Any] | tuple[Any, ...] | None = None) -> Any:
    """Answer query ``name`` of a run: replay its recorded history read-only (no activity
    runs, nothing is written, no lease is taken) and call the handler the workflow
    registered with ``ctx.on_query`` with ``*args``. Works on finished runs too.

    Raises ``UnknownHandler`` (listing the registered names), ``QueryFailed`` when the
    handler raises, ``NonDeterminismError`` when the code no longer matches the history."""
    name = _message_name(name, "query")
    if args is None:
        args = []
    if not isinstance(args, list | tuple):
        raise InvalidInput(f"query args must be a list; got {type(args).__name__}")
    values = _encode_payload(list(args), f"the arguments of query {name}")
    run = get_run(ref)
    ctx = _replay(run)
    handler = ctx._query_handlers.get(name)
    if handler is None:
        raise _unknown_handler("query", name, run, ctx)
    try:
        value = handler(*values)
        return codec.roundtrip(value, what=f"the result of query {name}")[0]
    except _Unwind:
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


def update(
    ref: str | uuid.UUID,
    name: str,
    payload: Any = None,
    *,
    update_id: str | None = None,
    wait: Duration = 10,
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
    name = _message_name(name, "update")
    key = _message_key(update_id, "update_id") if update_id is not None else uuid.uuid4().hex
    seconds = parse_duration(wait, what="wait")
    value = _encode_payload(payload, f"the payload of update {name}")
    run = get_run(ref)
    existing = Update.objects.using(weft_settings.DATABASE_ALIAS).filter(run=run, update_id=key).first()
    if existing is None:
        if run.status in TERMINAL_STATUSES:
            raise _terminal(run, f"update {name!r}")
        ctx = _replay(run)
        entry = ctx._update_handlers.get(name)
        if entry is None:
            raise _unknown_handler("update", name, run, ctx)
        validate_payload(entry.validator, value, what=f"the validator of update {name!r}")
        store = get_store()
        with transaction.atomic(using=store.alias):
            existing, created, woken = store.accept_update(
                run.pk, key, name, value, dispatched=delivers(get_dispatcher())
            )
            if woken:
                _dispatch_on_commit(str(run.pk))
        if created:
            logger.info("run %s: update %s %s accepted%s", run.pk, name, key, " and woke it" if woken else "")
    if existing.name != name:
        raise InvalidInput(
            f"update_id {key!r} of run {run.pk} was used for update {existing.name!r}, not {name!r}; "
            "use a new update_id"
        )
    return _await_update(existing.pk, seconds)


def update_result(ref: str | uuid.UUID, update_id: str, *, wait: Duration = 0) -> Any:
    """The outcome of an accepted update: its result, or ``UpdateFailed``; waits up to
    ``wait`` seconds for it, then raises ``UpdateTimeout``."""
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
    return _await_update(pk, seconds)


def _await_update(pk: int, wait: float, poll: float = 0.002) -> Any:
    deadline = time.monotonic() + wait
    updates = Update.objects.using(weft_settings.DATABASE_ALIAS)
    delay = poll
    while True:
        row = updates.filter(pk=pk).values("status", "result", "error", "update_id", "run_id", "name").first()
        if row is None:
            raise UpdateNotFound(f"update {pk} no longer exists: its run was purged")
        if row["status"] == UpdateStatus.COMPLETED:
            return row["result"]
        if row["status"] in (UpdateStatus.FAILED, UpdateStatus.REJECTED):
            error = row["error"] or {}
            raise UpdateFailed(
                f"update {row['name']!r} ({row['update_id']}) of run {row['run_id']} failed: "
                f"{error.get('type')}: {error.get('message')}",
                run_id=str(row["run_id"]),
                update_id=row["update_id"],
                error_type=error.get("type"),
                error_message=error.get("message"),
                error_traceback=error.get("traceback"),
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise UpdateTimeout(
                f"update {row['name']!r} of run {row['run_id']} is accepted but not applied yet "
                f"after {wait} s; poll with update_result(..., {row['update_id']!r})",
                run_id=str(row["run_id"]),
                update_id=row["update_id"],
            )
        time.sleep(min(delay, remaining))
        delay = min(delay * 1.5, 0.1)


def _terminal(run: WorkflowRun, what: str) -> WorkflowTerminalError:
    return WorkflowTerminalError(
        f"run {run.pk} ({run.workflow_name} {run.workflow_id}) is {run.status}: a finished run takes no "
        f"{what}; start a new run",
        run_id=str(run.pk),
        workflow_id=run.workflow_id,
        status=run.status,
    )


# -- lifecycle: cancel, suspend, resume, retry ------------------------------------------


def _on_live_run(ref: str | uuid.UUID, transition: Callable[[WorkflowRun], Any]) -> WorkflowRun:
    """Apply ``transition`` to the run in a transaction; if the run turns out to have
    continued as new (between looking it up and locking it, or by its run id), apply it
    to the run it continued as."""
    run = get_run(ref)
    alias = weft_settings.DATABASE_ALIAS
    for _ in range(100):
        try:
            with transaction.atomic(using=alias):
                transition(run)
            return run
        except WorkflowTerminalError as exc:
            if getattr(exc, "status", None) != RunStatus.CONTINUED:
                raise
            result = (
                WorkflowRun.objects.using(alias).filter(pk=run.pk).values_list("result", flat=True).first()
            )
            run = get_run((result or {})["continued_as"])
    raise AssertionError(f"run {ref} continued as new more than 100 times while being changed")


def cancel(ref: str | uuid.UUID, reason: str | None = None) -> str:
    """Cancel a run now: it is ``cancelled`` durably on return, whichever process drives
    it (that worker is deposed at its next write and stops), its pending timers are
    removed and its pending updates failed; ``result()`` raises ``WorkflowCancelled``.
    Works on suspended runs; raises ``WorkflowTerminalError`` for a finished run."""
    if reason is not None and not isinstance(reason, str):
        raise InvalidInput(f"reason must be a string; got {type(reason).__name__}")
    store = get_store()

    def transition(run: WorkflowRun) -> None:
        closed = store.cancel(run.pk, reason)
        if closed.get("woken_parent"):
            _dispatch_on_commit(closed["woken_parent"])
        if closed.get("finalizer"):
            transaction.on_commit(lambda: dispatch_finalizer(str(run.pk), 1), using=store.alias)

    run = _on_live_run(ref, transition)
    logger.info("run %s (%s %s): cancelled%s", run.pk, run.workflow_name, run.workflow_id,
                f" ({reason})" if reason else "")  # fmt: skip
    for child in store.close_children(str(run.pk), f"its parent run {run.pk} was cancelled"):
        logger.info("run %s: cancelled, its parent run %s was cancelled", child, run.pk)
    return RunStatus.CANCELLED


def suspend(ref: str | uuid.UUID) -> str:
    """Suspend a running or waiting run: no worker drives it (one driving it now is
    deposed at its next write) until :func:`resume`. Signals and updates sent meanwhile
    are kept; timers that come due meanwhile are collected and re-armed by the resume.
    Raises ``InvalidTransition`` for other states (``WorkflowTerminalError`` if finished)."""
    store = get_store()
    run = _on_live_run(ref, lambda run: store.suspend(run.pk))
    logger.info("run %s (%s %s): suspended", run.pk, run.workflow_name, run.workflow_id)
    return RunStatus.SUSPENDED


def resume(ref: str | uuid.UUID) -> str:
    """Resume a suspended run: it becomes runnable and a worker continues it where it
    waits (a sleep whose time passed meanwhile ends at once). Raises
    ``InvalidTransition`` if the run is not suspended."""
    store = get_store()

    def transition(run: WorkflowRun) -> None:
        store.resume(run.pk, dispatched=delivers(get_dispatcher()))
        _dispatch_on_commit(str(run.pk))

    run = _on_live_run(ref, transition)
    logger.info("run %s (%s %s): resumed", run.pk, run.workflow_name, run.workflow_id)
    return RunStatus.RUNNING


def retry(ref: str | uuid.UUID) -> str:
    """Reactivate a failed run: the failed step (if a step failed it) is attempted afresh
    and every step before it replays, so nothing that completed runs again. After a
    ``NonDeterminismError``, retry once the code matches the history again. Raises
    ``InvalidTransition`` if the run has not failed, or if another run with its workflow
    id is active."""
    run = get_run(ref)
    store = get_store()
    with transaction.atomic(using=store.alias):
        outcome = store.reactivate(run.pk, dispatched=delivers(get_dispatcher()))
        _dispatch_on_commit(str(run.pk))
    removed = outcome.get("removed_from")
    logger.info("run %s (%s %s): retried%s", run.pk, run.workflow_name, run.workflow_id,
                f" from position {removed}" if removed is not None else "")  # fmt: skip
    return RunStatus.RUNNING


# -- turns and the sweep ---------------------------------------------------------------


def run_turn(run_id: str) -> TurnOutcome:
    """Claim ``run_id`` and drive it until it parks or finishes (safe to call for any id)."""
    return get_engine().run_turn(str(run_id))


class ActivityOutcome(enum.StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"  # this attempt failed; the workflow decides on a retry
    SKIPPED = "skipped"  # a duplicate delivery, a stale attempt or a finished run
    DISCARDED = "discarded"  # ran, but the attempt was lost meanwhile: not recorded


def run_activity(run_id: str, seq: int, attempt: int) -> ActivityOutcome:
    """Run attempt ``attempt`` of the queued activity at position ``seq`` of a run.

    Safe to call for any delivery: exactly one caller takes a given attempt (a duplicate
    gets ``SKIPPED``), and its outcome is recorded only if the attempt is still current
    (fenced by run, seq and attempt). A recorded outcome wakes the run when it waits for
    it. ``atomic=True`` activities run inside the transaction that records them.
    """
    from .heartbeat import ensure_heartbeat, running_attempt

    if seq == FINALIZER_SEQ:
        return run_finalizer(run_id, attempt)
    store = get_store()
    run_id = str(run_id)
    started = store.start_activity(run_id, seq, attempt, weft_settings.LEASE_TTL)
    if started is None:
        logger.info("run %s: activity %s attempt %s is not startable (duplicate or stale); skipped",
                    run_id, seq, attempt)  # fmt: skip
        return ActivityOutcome.SKIPPED
    ensure_heartbeat()
    name = started["name"]
    act = registry.activities.get(name)
    info = ActivityInfo(run_id, started["workflow_id"], started["workflow_name"], name, seq, attempt)
    label = f"run {run_id}: activity {name} (position {seq}, attempt {attempt})"
    outcome: list[str] = []

    def call() -> tuple[str, str | None, str | None]:
        written = _call_activity(act, info, started["args"], store.alias) if act is not None else (
            StepStatus.ATTEMPT_FAILED,
            None,
            codec.dumps({
                "type": "django_weft.ActivityNotRegistered",
                "message": f"activity {name!r} is not registered in worker {get_engine().engine_id}",
                "retryable": True,
            }),
        )  # fmt: skip
        outcome.append(written[0])
        return written

    with running_attempt(run_id, seq, attempt):
        if act is not None and act.atomic:
            recorded, woken = store.finish_activity(run_id, seq, attempt, status="", body=call)
        else:
            status, result_json, error_json = call()
            recorded, woken = store.finish_activity(
                run_id, seq, attempt, status=status, result_json=result_json, error_json=error_json
            )
    if woken:
        try:
            get_dispatcher().dispatch_turn(run_id)
        except Exception:
            logger.warning("run %s: could not dispatch a turn; the sweep will", run_id, exc_info=True)
    if not recorded:
        logger.warning("%s: ran, but the attempt is no longer current; outcome discarded", label)
        return ActivityOutcome.DISCARDED
    failed = outcome[0] == StepStatus.ATTEMPT_FAILED
    logger.info("%s: %s", label, "attempt failed" if failed else "completed")
    return ActivityOutcome.FAILED if failed else ActivityOutcome.COMPLETED


def run_finalizer(run_id: str, attempt: int) -> ActivityOutcome:
    """Run attempt ``attempt`` of a cancelled or timed-out run's finalizer with the state
    the workflow recorded (``ctx.set_finalizer_state``), and record its outcome on the
    run. At least once: a duplicate delivery of an attempt is skipped, and a worker that
    dies mid-attempt leaves its lease to run out, after which the sweep sends the next
    attempt. Failures are retried by the finalizer activity's retry policy."""
    store = get_store()
    run_id = str(run_id)
    lease = weft_settings.LEASE_TTL
    started = store.start_finalizer(run_id, attempt, lease)
    if started is None:
        logger.info(
            "run %s: finalizer attempt %s is not startable (duplicate or stale); skipped", run_id, attempt
        )
        return ActivityOutcome.SKIPPED
    name, state = started
    if name is None:
        definition = registry.workflows.get(
            WorkflowRun.objects.using(store.alias).values_list("workflow_name", flat=True).get(pk=run_id)
        )
        if definition is None or definition.finalizer is None:
            store.finish_finalizer(run_id, attempt, drop=True)
            logger.info("run %s: its workflow has no finalizer here; none to run", run_id)
            return ActivityOutcome.SKIPPED
        name = definition.finalizer.name
    act = registry.activities.get(name)
    run = WorkflowRun.objects.using(store.alias).values("workflow_id", "workflow_name").get(pk=run_id)
    info = ActivityInfo(run_id, run["workflow_id"], run["workflow_name"], name, FINALIZER_SEQ, attempt)
    label = f"run {run_id}: finalizer {name} (attempt {attempt})"
    if act is None:
        error: dict[str, Any] | None = {
            "type": "django_weft.ActivityNotRegistered",
            "message": f"activity {name!r} is not registered in worker {get_engine().engine_id}",
        }
        retryable = True
        policy = weft_settings.DEFAULT_RETRY_POLICY
        result = None
    else:
        from .heartbeat import ensure_heartbeat, running_attempt

        ensure_heartbeat()
        with running_attempt(run_id, FINALIZER_SEQ, attempt):  # the heartbeat renews its lease
            _, result_json, error_json = _call_activity(
                act, info, {"args": [state], "kwargs": {}}, store.alias
            )
        result = codec.loads(result_json) if result_json is not None else None
        error = codec.loads(error_json) if error_json is not None else None
        retryable = bool(error.pop("retryable", True)) if error else False
        policy = act.retry or weft_settings.DEFAULT_RETRY_POLICY
    faults.hit("before_finalizer_finish", run_id=run_id, engine=get_engine())
    retry_in = policy.delay_after(attempt) if error and retryable and attempt < policy.max_attempts else None
    if not store.finish_finalizer(run_id, attempt, result=result, error=error, retry_in=retry_in):
        logger.warning("%s: ran, but the attempt is no longer current; outcome discarded", label)
        return ActivityOutcome.DISCARDED
    if error is None:
        logger.info("%s: completed", label)
        return ActivityOutcome.COMPLETED
    logger.warning("%s: failed (%s: %s)%s", label, error.get("type"), error.get("message"),
                   f"; retried in {retry_in:.1f} s" if retry_in is not None else "")  # fmt: skip
    return ActivityOutcome.FAILED


def dispatch_finalizer(run_id: str, attempt: int, dispatcher: Any = None) -> None:
    """Send attempt ``attempt`` of a run's finalizer to a worker (a doorbell: the
    finalizer's timer makes the sweep send it again if this is lost)."""
    dispatcher = dispatcher or get_dispatcher()
    if not delivers(dispatcher):
        return
    row = (
        WorkflowRun.objects.using(weft_settings.DATABASE_ALIAS)
        .filter(pk=run_id)
        .values("finalizer", "workflow_name")
        .first()
    )
    if row is None:
        return  # purged meanwhile
    definition = registry.workflows.get(row["workflow_name"])
    name = (row["finalizer"] or {}).get("activity") or (
        definition.finalizer.name if definition is not None and definition.finalizer else None
    )
    act = registry.activities.get(str(name))
    queue = (act.queue if act is not None else None) or ""
    try:
        dispatcher.dispatch_activity(
            str(run_id), FINALIZER_SEQ, attempt, queue=queue, timeout=act.timeout if act else None
        )
    except Exception:
        logger.warning("run %s: could not dispatch its finalizer; the sweep will", run_id, exc_info=True)


def _call_activity(
    act: Activity[..., Any], info: ActivityInfo, payload: dict[str, Any], alias: str
) -> tuple[str, str | None, str | None]:
    """Run the activity function; return the step's (status, result_json, error_json).

    An atomic activity runs in a savepoint of the recording transaction, so a failed
    attempt's writes roll back while its failure is still recorded."""
    token = _current_activity.set(info)
    try:
        if act.atomic:
            with transaction.atomic(using=alias):
                value = act.fn(*payload.get("args", []), **payload.get("kwargs", {}))
                result_json = codec.dumps(value, what=f"the result of activity {act.name}")
        else:
            value = act.fn(*payload.get("args", []), **payload.get("kwargs", {}))
            result_json = codec.dumps(value, what=f"the result of activity {act.name}")
        return StepStatus.COMPLETED, result_json, None
    except Exception as exc:
        policy = act.retry or weft_settings.DEFAULT_RETRY_POLICY
        error = describe_exception(exc)
        error["retryable"] = policy.is_retryable(exc) and not isinstance(exc, PayloadError)
        return StepStatus.ATTEMPT_FAILED, None, codec.dumps(error)
    finally:
        _current_activity.reset(token)


@dataclass
class TickReport:
    fired: int = 0
    dispatched: int = 0
    purged: int = 0
    run_ids: list[str] = field(default_factory=list)
    taken_over: list[str] = field(default_factory=list)
    """The dispatched runs whose owner's lease had expired (its worker died or stalled)."""
    closed_children: list[str] = field(default_factory=list)
    """Child runs cancelled because their parent had closed (its parent-close policy)."""
    finalizers: int = 0
    """Finalizer attempts sent (first attempts of timed-out runs, retries, lost attempts)."""


_last_purge = [0.0]


def tick(dispatcher: Any = None) -> TickReport:
    """One sweep: fire due timers, then dispatch runnable runs and expired leases.

    Safe to run from several processes at once: rows are taken with
    ``select_for_update(skip_locked=True)``, so each timer fires once.
    """
    dispatcher = dispatcher or get_dispatcher()
    store = get_store()
    batch = weft_settings.TICK_BATCH
    report = TickReport()
    report.fired = len(store.fire_due_timers(batch))
    # Children left running by parents that closed without applying their policy (a
    # process died in between; timed-out parents always come this way).
    report.closed_children = store.close_orphaned_children(batch)
    store.wake_waiting_parents(batch)
    finalizers = (
        store.claim_due_finalizers(batch, weft_settings.REDISPATCH_AFTER) if delivers(dispatcher) else []
    )
    for run_id, attempt in finalizers:
        dispatch_finalizer(run_id, attempt, dispatcher)
    report.finalizers = len(finalizers)
    if delivers(dispatcher):
        runnable, expired = store.claim_dispatch_batch(
            batch, weft_settings.REDISPATCH_AFTER, weft_settings.TAKEOVER_GRACE
        )
        ids = runnable + expired
        for run_id in ids:
            dispatcher.dispatch_turn(run_id)
        if ids:
            logger.debug("tick: dispatched %s", ", ".join(ids))
        report.dispatched = len(ids)
        report.run_ids = ids
        report.taken_over = expired
    retention = weft_settings.RETENTION
    if retention is not None and time.monotonic() - _last_purge[0] > 60:
        _last_purge[0] = time.monotonic()
        report.purged = store.purge_terminal_before(store.db_now() - retention, batch)
    return report


# -- reading ---------------------------------------------------------------------------


def get_run(ref: str | uuid.UUID) -> WorkflowRun:
    """The run with this run id, or the latest run with this workflow id."""
    runs = WorkflowRun.objects.using(weft_settings.DATABASE_ALIAS)
    run = None
    try:
        run_uuid = ref if isinstance(ref, uuid.UUID) else uuid.UUID(str(ref))
    except ValueError:
        run_uuid = None
    if run_uuid is not None:
        run = runs.filter(pk=run_uuid).first()
    if run is None:
        run = runs.for_workflow_id(str(ref)).first()
    if run is None:
        raise WorkflowNotFound(f"no workflow run has run id or workflow id {str(ref)!r}", ref=str(ref))
    return run


def describe(run: WorkflowRun) -> dict[str, Any]:
    return {
        "run_id": str(run.pk),
        "workflow_id": run.workflow_id,
        "workflow": run.workflow_name,
        "version": run.workflow_version,
        "status": run.status,
        "args": run.args,
        "kwargs": run.kwargs,
        "result": run.result,
        "error": run.error,
        "failure_category": run.failure_category or None,
        "attempt": run.attempt,
        "search_attributes": run.search_attributes,
        "waiting_on": run.waiting_on,
        "execution_deadline": run.execution_deadline,
        "owner_id": run.owner_id,
        "owner_epoch": run.owner_epoch,
        "lease_expires_at": run.lease_expires_at,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "finished_at": run.finished_at,
        "parent_run_id": str(run.parent_id) if run.parent_id else None,
    }


def history(run: WorkflowRun) -> list[dict[str, Any]]:
    steps = Step.objects.using(weft_settings.DATABASE_ALIAS).filter(run=run).order_by("seq")
    return [
        {
            "seq": step.seq,
            "kind": step.kind,
            "name": step.name,
            "status": step.status,
            "args": step.args,
            "result": step.result,
            "error": step.error,
            "attempt": step.attempt,
            "started_at": step.started_at,
            "finished_at": step.finished_at,
        }
        for step in steps
    ]


def result_of(run_id: str, timeout: float | None = None, poll: float = 0.01) -> Any:
    """Wait for the run to finish and return its result, or raise its outcome's error.

    A ``continued`` run is followed to its successor.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = poll
    current = str(run_id)
    runs = WorkflowRun.objects.using(weft_settings.DATABASE_ALIAS)
    while True:
        row = runs.filter(pk=current).values("status", "result", "error", "workflow_id").first()
        if row is None:
            raise WorkflowNotFound(f"run {current} no longer exists", ref=current)
        status = row["status"]
        if status == RunStatus.COMPLETED:
            return row["result"]
        if status == RunStatus.CONTINUED:
            current = (row["result"] or {})["continued_as"]
            continue
        if status in TERMINAL_STATUSES:
            raise _outcome_error(current, row["workflow_id"], status, row["error"] or {})
        if deadline is not None and time.monotonic() >= deadline:
            raise ResultTimeout(
                f"run {current} is still {status} after {timeout} s; call result() again later",
                run_id=current,
                status=status,
            )
        pause = delay if deadline is None else min(delay, max(deadline - time.monotonic(), 0))
        time.sleep(pause)
        delay = min(delay * 1.5, 0.25)


def _outcome_error(run_id: str, workflow_id: str, status: str, error: dict[str, Any]) -> Exception:
    if status == RunStatus.FAILED:
        return WorkflowFailed(
            f"run {run_id} ({workflow_id}) failed: {error.get('type')}: {error.get('message')}",
            run_id=run_id,
            workflow_id=workflow_id,
            error_type=error.get("type"),
            error_message=error.get("message"),
            error_traceback=error.get("traceback"),
            details=error,
        )
    if status == RunStatus.CANCELLED:
        return WorkflowCancelled(
            f"run {run_id} ({workflow_id}) was cancelled",
            run_id=run_id,
            workflow_id=workflow_id,
            reason=error.get("reason"),
        )
    return WorkflowTimedOut(
        f"run {run_id} ({workflow_id}) passed its execution timeout", run_id=run_id, workflow_id=workflow_id
    )


@dataclass(frozen=True)
class StatusReport:
    counts: dict[str, int]
    oldest_waiting: WorkflowRun | None
    oldest_runnable: WorkflowRun | None
    expired_leases: int
    due_timers: int
    oldest_due_timer: datetime | None


def status_report() -> StatusReport:
    store = get_store()
    runs = WorkflowRun.objects.using(store.alias)
    counts: dict[str, int] = {str(status): 0 for status in RunStatus}
    for row in runs.order_by().values("status").annotate(n=Count("pk")):
        counts[row["status"]] = row["n"]
    now = store.db_now()
    timers = Timer.objects.using(store.alias).due(now).aggregate(n=Count("pk"), oldest=Min("fire_at"))
    return StatusReport(
        counts=counts,
        oldest_waiting=runs.filter(status=RunStatus.WAITING).order_by("updated_at").first(),
        oldest_runnable=runs.runnable().order_by("ready_at").first(),
        expired_leases=runs.expired_leases(now, 0).count(),
        due_timers=timers["n"],
        oldest_due_timer=timers["oldest"],
    )
