"""Starting runs: validated start options, ``start`` and ``signal_with_start``."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.db import IntegrityError, transaction
from django.db.models import Model

from ..conf import weft_settings
from ..engine import codec, observe, run_logging
from ..engine.durations import Duration, parse_duration
from ..engine.errors import (
    ConcurrencyLimited,
    InvalidInput,
    WorkflowAlreadyExists,
    WorkflowTerminalError,
)
from ..engine.flow import OnLimit
from ..engine.records import (
    TERMINAL_STATUSES,
    RunStatus,
)
from ..engine.registry import Workflow, registry
from ..engine.run_logging import get_logger
from ..models import WorkflowRun
from ..models.runs import WORKFLOW_ID_MAX_LENGTH
from ..store import DjangoStore, JoinedBurst
from .dispatch import delivers, get_dispatcher
from .lifecycle import cancel
from .messages import SignalAccepted, _accepted, _encode_payload, _message_key, _message_name
from .operations import OPERATIONS, START_PRIORITY
from .process import dispatch_on_commit, get_store, sends_notices
from .reading import get_run
from .records import RunRecord

logger = get_logger("django_weft.runtime")

_T = TypeVar("_T")

ON_CONFLICT_CHOICES = OPERATIONS["start"].values("on_conflict")


@dataclass(frozen=True)
class StartResult:
    run_id: str
    workflow_id: str
    created: bool
    record: RunRecord | None = None
    """The run as it stands after the start, where known without reading it again (a
    run found by its id, or a plain start); ``None`` otherwise."""


def _validate_workflow_id(workflow_id: Any) -> str:
    if not isinstance(workflow_id, str):
        raise InvalidInput(f"id must be a string; got {type(workflow_id).__name__}")
    if not workflow_id.strip():
        raise InvalidInput("id must not be empty or blank; omit it to get a generated id")
    if len(workflow_id) > WORKFLOW_ID_MAX_LENGTH:
        raise InvalidInput(f"id is {len(workflow_id)} characters long; the limit is {WORKFLOW_ID_MAX_LENGTH}")
    flaw = codec.text_flaw(workflow_id)
    if flaw:
        raise InvalidInput(f"id must not contain {flaw}")
    return workflow_id


RELATED_OBJECT_ATTRIBUTE = "weft_object"
"""The search attribute holding a run's ``related_object``: ``"<app_label>.<model>:<pk>"``."""


def related_object_key(obj: Any) -> str:
    """``obj`` as :data:`RELATED_OBJECT_ATTRIBUTE` stores it; ``InvalidInput`` for anything
    but a saved model instance."""
    if not isinstance(obj, Model):
        raise InvalidInput(f"related_object must be a model instance; got {type(obj).__name__}")
    if obj.pk is None:
        raise InvalidInput(f"related_object {obj._meta.label} is not saved (it has no primary key yet)")
    key = f"{obj._meta.label_lower}:{obj.pk}"
    flaw = codec.text_flaw(key)
    if flaw:
        raise InvalidInput(f"related_object's primary key must not contain {flaw}")
    return key


@dataclass(frozen=True)
class StartOptions:
    """How to start a run, as the caller gave it: the options :func:`start`,
    :func:`signal_with_start` and the client's ``start`` share. Checked by the start
    (``InvalidInput``), not here.

    ``id`` is the workflow id (the business key; a generated one if omitted);
    ``on_conflict`` what to do when a run with that id exists (``use_existing``,
    ``fail``, ``start_new_if_terminal``); ``execution_timeout`` bounds the whole run
    (its continue-as-new chain included); ``start_delay`` leaves it ``pending`` that
    long; ``search_attributes`` are stored with it for filtering; ``related_object`` (a
    saved model instance) is the business object the run is for, stored as the search
    attribute :data:`RELATED_OBJECT_ATTRIBUTE` (``"orders.order:42"``): the admin's run
    page links to that object's admin page, and ``weft_object=orders.order:42`` finds
    its runs. ``priority`` (-100..100, higher first, 0 by default) orders it among the
    runs waiting for a worker or for a concurrency slot."""

    id: str | None = None
    on_conflict: str = "use_existing"
    execution_timeout: Duration | None = None
    start_delay: Duration | None = None
    search_attributes: dict[str, Any] | None = None
    related_object: Model | None = None
    priority: int = START_PRIORITY.default


@dataclass(frozen=True)
class _StartSpec:
    """A start request, validated and encoded: nothing is written until it is whole."""

    definition: Workflow[..., Any]
    fields: dict[str, Any]
    workflow_id: str | None
    on_conflict: str
    timeout: float | None
    delay: float | None

    @property
    def priority(self) -> int:
        return int(self.fields["priority"])

    @property
    def limited(self) -> bool:
        """Whether its workflow has a concurrency limit: the start then takes a slot, or
        queues for one, or applies the limit's ``on_limit``, under its key's lock."""
        return self.definition.concurrency is not None

    @property
    def debounced(self) -> bool:
        """Whether its workflow debounces its starts: this start joins its key's burst or
        opens one, under the key's lock."""
        return self.definition.debounce is not None

    @property
    def under_flow_lock(self) -> bool:
        """Whether its transaction runs inside the store's flow lock (SQLite's process lock)."""
        return self.limited or self.debounced

    def collects_starts(self, run: WorkflowRun) -> bool:
        """Whether ``run`` is the pending run of this start's debounce key (its burst)."""
        return (
            self.debounced
            and run.workflow_name == self.definition.name
            and run.debounce_key == self.fields["debounce_key"]
            and run.status == RunStatus.PENDING
            and run.slot == ""
        )


def _prepare_start(
    workflow: str,
    args: list[Any] | tuple[Any, ...] | None,
    kwargs: dict[str, Any] | None,
    options: StartOptions,
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
    definition.check_arguments(args_value, kwargs_value)
    search_attributes = options.search_attributes
    if search_attributes is None:
        search_attributes = {}
    if not isinstance(search_attributes, dict):
        raise InvalidInput("search_attributes must be a dict")
    attributes = codec.loads(codec.dumps(search_attributes, what="search_attributes", limit=limit))
    if options.related_object is not None:
        attributes[RELATED_OBJECT_ATTRIBUTE] = related_object_key(options.related_object)
    on_conflict = options.on_conflict
    if on_conflict not in ON_CONFLICT_CHOICES:  # the catalogue's choices (.operations)
        raise InvalidInput(
            f"on_conflict must be one of {', '.join(ON_CONFLICT_CHOICES)}; got {on_conflict!r}"
        )
    execution_timeout, start_delay = options.execution_timeout, options.start_delay
    timeout = (
        parse_duration(execution_timeout, what="execution_timeout") if execution_timeout is not None else None
    )
    if timeout is not None and timeout <= 0:
        raise InvalidInput(
            "execution_timeout must be longer than 0 seconds (a run with none has no limit: omit it)",
            field="execution_timeout",
        )
    delay = parse_duration(start_delay, what="start_delay") if start_delay is not None else None
    if delay and definition.debounce is not None:
        raise InvalidInput(
            f"workflow {definition.name!r} is debounced: a run starts "
            f"{definition.debounce.period_seconds:g} s after the last start of its key, so its starts take "
            "no start_delay; omit it",
            field="start_delay",
        )
    fields: dict[str, Any] = {
        "workflow_name": definition.name,
        "workflow_version": definition.version,
        "args": args_value,
        "kwargs": kwargs_value,
        "search_attributes": attributes,
        "priority": START_PRIORITY.check(options.priority),  # the catalogue's range (.operations)
    }
    if definition.concurrency is not None:
        fields["concurrency_key"] = definition.concurrency.key_of(definition.name, args_value, kwargs_value)
    if definition.debounce is not None:
        fields["debounce_key"] = definition.debounce.key_of(definition.name, args_value, kwargs_value)
    return _StartSpec(
        definition=definition,
        fields=fields,
        workflow_id=_validate_workflow_id(options.id) if options.id is not None else None,
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
    related_object: Model | None = None,
    priority: int = 0,
) -> StartResult:
    """Create a run of ``workflow``, unowned and runnable (or ``pending`` with a delay).

    Everything is validated before anything is written. Idempotent by ``id``:
    ``use_existing`` (default) returns the latest run with that id if there is one,
    ``fail`` raises :class:`WorkflowAlreadyExists`, ``start_new_if_terminal`` returns a
    live run with that id or starts a new one when the latest has finished.

    A workflow with a concurrency limit (docs/how-to/flow-control.md) whose key's slots
    are taken: ``on_limit="cancel_new"`` raises :class:`ConcurrencyLimited` (nothing
    written), ``"skip"`` returns the oldest run holding the key (``created=False``),
    ``"cancel_running"`` cancels it and starts this one; ``"queue"`` starts it, to wait
    for a slot.

    A debounced workflow (:class:`~django_weft.Debounce`): the start joins the pending
    run of its debounce key if there is one (``created=False``; the run takes this
    start's arguments and options, and starts ``period`` after it, within ``max_wait`` of
    the first start of the burst), else it creates that run, pending for ``period``. A
    start with ``id=`` looks its id up first (``on_conflict``): a run found by it is
    returned as for any start, unless it is the key's pending run, which the start joins.
    ``start_delay`` is refused.
    """
    options = StartOptions(
        id=id,
        on_conflict=on_conflict,
        execution_timeout=execution_timeout,
        start_delay=start_delay,
        search_attributes=search_attributes,
        related_object=related_object,
        priority=priority,
    )
    return start_with(workflow, args, kwargs, options)


def start_with(
    workflow: str,
    args: list[Any] | tuple[Any, ...] | None,
    kwargs: dict[str, Any] | None,
    options: StartOptions,
) -> StartResult:
    """:func:`start` with its options in one :class:`StartOptions`."""
    with observe.starting(str(workflow)) as seen:
        started = _start(workflow, args, kwargs, options)
        seen.run_id, seen.workflow_id, seen.created = started.run_id, started.workflow_id, started.created
        return started


def _start(
    workflow: str,
    args: list[Any] | tuple[Any, ...] | None,
    kwargs: dict[str, Any] | None,
    options: StartOptions,
) -> StartResult:
    spec = _prepare_start(workflow, args, kwargs, options)
    store = get_store()
    run_id = uuid.uuid4()
    if spec.workflow_id is None and spec.delay is None and spec.timeout is None and not spec.under_flow_lock:
        # Nothing to look up, nothing to compute from the database clock: one INSERT in
        # autocommit (the run's new id cannot conflict), with the notice to the workers in
        # the same statement, or the doorbell rung after it.
        carrier = observe.start_carrier()
        delivered = delivers(get_dispatcher())
        fields = _with_carrier(spec.fields, carrier)
        inserted = store.intake.insert_runnable_run(
            run_id, fields, dispatched=delivered, notify=sends_notices()
        )
        observe.run_started(run_id=str(run_id), workflow_id=str(run_id), workflow=spec.definition.name,
                            priority=spec.priority, carrier=carrier)  # fmt: skip
        if delivered:
            dispatch_on_commit(str(run_id), priority=spec.priority)
        store.intake.announce_run_started(run_id, str(run_id), spec.definition.name)
        logger.info("run %s (%s %s): started", run_id, spec.definition.name, run_id,
                    extra=run_logging.fields_of(run_id, str(run_id), spec.definition.name))  # fmt: skip
        # ready_at is the database's now() expression here; the record does not show it.
        record = dataclasses.replace(RunRecord.of(inserted), ready_at=None)
        return StartResult(str(run_id), str(run_id), created=True, record=record)

    def find_or_create() -> StartResult:
        _lock_debounce_key(store, spec)
        existing = None
        if spec.workflow_id is not None:
            existing = _existing_for_start(store, spec.workflow_id, spec.on_conflict)
            if existing is not None and not spec.collects_starts(existing):
                return StartResult(
                    str(existing.pk), existing.workflow_id, created=False, record=RunRecord.of(existing)
                )
        joined = _join_burst(store, spec)
        if joined is not None:
            return StartResult(joined.run_id, joined.workflow_id, created=False)
        if existing is not None:
            # The run of this id was its key's burst, and its time had come: the join made
            # it runnable, and it is the live run of this id.
            return StartResult(str(existing.pk), existing.workflow_id, created=False)
        held = _held_key(store, spec)
        if held is not None:
            return StartResult(str(held.pk), held.workflow_id, created=False, record=RunRecord.of(held))
        run = _create_run(store, spec, run_id, observe.start_carrier())
        return StartResult(str(run.pk), run.workflow_id, created=True)

    # A debounced start retries too: on SQLite, a start of another process may win the
    # race to open the key's burst (the unique index of bursts refuses the second), and
    # the start then joins it.
    retry = spec.workflow_id is not None or spec.debounced
    with store.flow.deciding_start() if spec.under_flow_lock else contextlib.nullcontext():
        started = _atomic_retrying_id_conflicts(store, find_or_create, retry=retry)
    if started.created:
        fields = run_logging.fields_of(started.run_id, started.workflow_id, spec.definition.name)
        logger.info("run %s (%s %s): started", started.run_id, spec.definition.name, started.workflow_id,
                    extra=fields)  # fmt: skip
    return started


def _atomic_retrying_id_conflicts(store: DjangoStore, body: Callable[[], _T], *, retry: bool = True) -> _T:
    """Run ``body`` in a transaction; up to three times if a concurrent start with the
    same workflow id won the one-active-run constraint (only reachable where the
    advisory lock is unavailable), looking again each time."""
    attempt = 0
    while True:
        attempt += 1
        try:
            with transaction.atomic(using=store.alias):
                return body()
        except IntegrityError:
            if not retry or attempt == 3:
                raise


def _lock_debounce_key(store: DjangoStore, spec: _StartSpec) -> None:
    """A debounced start, first in its transaction: the lock of its debounce key, taken
    before the workflow id's lock and before a concurrency group's (the order every start
    keeps, so none deadlocks with another)."""
    if spec.debounced:
        store.debounce.lock_key(spec.definition.name, spec.fields["debounce_key"])


def _join_burst(store: DjangoStore, spec: _StartSpec) -> JoinedBurst | None:
    """A debounced start that did not find its run by id: join its key's burst, if it has
    one (a start that opens one is decided by ``on_limit``, one that joins is not)."""
    debounce = spec.definition.debounce
    if debounce is None:
        return None
    name, key = spec.definition.name, spec.fields["debounce_key"]
    return store.debounce.join(name, key, spec.fields, debounce, timeout=spec.timeout)


def _held_key(store: DjangoStore, spec: _StartSpec) -> WorkflowRun | None:
    """A start whose workflow's limit is decided at start, in its transaction: go ahead
    (``None``) if its key has a free slot; else, by ``on_limit``, raise
    :class:`ConcurrencyLimited`, return the oldest run holding the key (``skip``), or
    cancel the oldest runs holding it until one slot is free (``cancel_running``)."""
    limit = spec.definition.concurrency
    if limit is None or limit.on_limit == OnLimit.QUEUE:
        return None
    name, key = spec.definition.name, spec.fields["concurrency_key"]
    live = store.flow.check_start(name, key, limit)
    if not live:
        return None
    oldest, _ = live[0]
    where = f"key {key!r}" if key else "the workflow"
    if limit.on_limit == OnLimit.CANCEL_NEW:
        raise ConcurrencyLimited(
            f"workflow {name!r} has all {limit.limit} concurrency slot(s) of {where} taken (the oldest "
            f"by run {oldest}), and its Concurrency(on_limit='cancel_new') refuses new starts until "
            "one frees",
            workflow=name,
            key=key,
            limit=limit.limit,
            run_id=str(oldest),
        )
    if limit.on_limit == OnLimit.SKIP:
        return get_run(str(oldest))
    for pk, _ in live[: len(live) - limit.limit + 1]:
        cancel(str(pk), f"a newer start of {name} took its concurrency slot ({where})")
    return None


def _create_run(
    store: DjangoStore, spec: _StartSpec, run_id: uuid.UUID, carrier: observe.Carrier | None
) -> WorkflowRun:
    """Have the store insert the run (and its timers), or a debounced start's pending run;
    ring its doorbell on commit. Runs inside the caller's transaction. ``carrier`` is the
    trace context the run stores (the start's: :func:`observe.start_carrier` in it)."""
    dispatched = delivers(get_dispatcher())
    debounce = spec.definition.debounce
    starts_at: datetime | None
    if debounce is not None:
        # A burst's run is a delayed start: it takes a concurrency slot when it is due.
        # The doorbell rings at the time the burst's first start sets; a later start that
        # moves the timer rings none (a burst of a thousand starts sends one message), and
        # the sweep fires the moved timer within a tick.
        run, starts_at = store.debounce.open(
            run_id,
            spec.workflow_id,
            _with_carrier(spec.fields, carrier),
            debounce,
            timeout=spec.timeout,
            dispatched=dispatched,
        )
    else:
        fields = _with_carrier(spec.fields, carrier)
        limit = spec.definition.concurrency
        if limit is not None and spec.delay is None:
            # A slot now, or a place in the queue (a delayed start takes one when it is due).
            fields = {
                **fields,
                **store.flow.admit_at_start(spec.definition.name, fields["concurrency_key"], limit),
            }
        run, starts_at = store.intake.create_run(
            run_id, spec.workflow_id, fields, timeout=spec.timeout, delay=spec.delay, dispatched=dispatched
        )
    if run.status == RunStatus.PENDING and starts_at is None:
        fields = run_logging.fields_of(run.pk, run.workflow_id, run.workflow_name)
        logger.info("run %s (%s %s): queued for a concurrency slot", run.pk, run.workflow_name,
                    run.workflow_id, extra=fields)  # fmt: skip
    else:
        dispatch_on_commit(str(run.pk), eta=starts_at, priority=spec.priority)
    store.intake.announce_run_started(run.pk, run.workflow_id, run.workflow_name)
    if run.pk == run_id:  # not a burst's run that this start joined
        observe.run_started(run_id=str(run.pk), workflow_id=run.workflow_id, workflow=run.workflow_name,
                            priority=spec.priority, carrier=carrier)  # fmt: skip
    return run


def _with_carrier(fields: dict[str, Any], carrier: dict[str, str] | None) -> dict[str, Any]:
    """A new run's fields with the trace context its start stores (none without tracing)."""
    return {**fields, "trace_context": carrier} if carrier else fields


def _existing_for_start(store: DjangoStore, workflow_id: str, on_conflict: str) -> WorkflowRun | None:
    """The run a start by ``workflow_id`` returns instead of creating one, or ``None`` to
    create one (``on_conflict`` decides); raises ``WorkflowAlreadyExists`` for ``fail``.
    Serialised with other starts by that id (the store's advisory lock)."""
    latest = store.intake.latest_run_locked(workflow_id)
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
    options = StartOptions(
        id=id,
        on_conflict="start_new_if_terminal",
        execution_timeout=execution_timeout,
        search_attributes=search_attributes,
    )
    with observe.starting(str(workflow)) as seen:
        spec = _prepare_start(workflow, args, kwargs, options)
        run_carrier = observe.start_carrier()  # the start's, not the signal's below
        # The signal as the observers see any signal (its span a child of the start's):
        # the turn that consumes it links to it.
        with observe.message_received("signal", str(signal), id) as sent:
            name = _message_name(signal, "signal")
            key = _message_key(signal_id, "signal_id") if signal_id is not None else None
            value = _encode_payload(payload, f"the payload of signal {name}")
            store = get_store()
            dispatched = delivers(get_dispatcher())
            with store.flow.deciding_start() if spec.under_flow_lock else contextlib.nullcontext():
                outcome = _atomic_retrying_id_conflicts(
                    store,
                    lambda: _signal_or_start(store, spec, id, name, value, key, dispatched, run_carrier),
                )
            sent.run_id, sent.workflow = outcome.run_id, spec.definition.name
            sent.outcome = "duplicate" if outcome.signal.duplicate else "stored"
        logger.info(
            "run %s (%s): signal %s %s", outcome.run_id, outcome.workflow_id, name,
            "with a new run" if outcome.created else "received",
            extra=run_logging.fields_of(outcome.run_id, outcome.workflow_id, spec.definition.name),
        )  # fmt: skip
        seen.run_id, seen.workflow_id, seen.created = outcome.run_id, outcome.workflow_id, outcome.created
        return outcome


def _signal_or_start(
    store: DjangoStore,
    spec: _StartSpec,
    workflow_id: str,
    name: str,
    value: Any,
    key: str | None,
    dispatched: bool,
    run_carrier: observe.Carrier | None,
) -> SignalWithStartResult:
    _lock_debounce_key(store, spec)
    # The advisory lock of starts by id serialises concurrent signal_with_starts.
    run = _existing_for_start(store, workflow_id, spec.on_conflict)
    if run is not None:
        try:
            delivery = store.intake.deliver_signal(
                run.pk, name, value, key, dispatched=dispatched, trace_context=observe.start_carrier()
            )
        except WorkflowTerminalError:
            # It finished between the look-up and deliver_signal's row lock; nothing was
            # written, so a new run takes its place.
            run = None
    created = False
    if run is None:
        # A debounced workflow's start joins its key's burst, and the burst's run is
        # signalled; a singleton (on_limit="skip") whose key is held is signalled in its
        # place.
        joined = _join_burst(store, spec)
        run = _held_key(store, spec) if joined is None else get_run(joined.run_id)
        created = run is None
        if run is None:
            run = _create_run(store, spec, uuid.uuid4(), run_carrier)
        delivery = store.intake.deliver_signal(
            run.pk, name, value, key, dispatched=dispatched, trace_context=observe.start_carrier()
        )
    if delivery.woken:
        dispatch_on_commit(str(run.pk))
    return SignalWithStartResult(
        str(run.pk), run.workflow_id, created, _accepted(delivery.signal, delivery.duplicate)
    )
