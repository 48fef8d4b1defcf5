"""Starting runs: validated start options, ``start`` and ``signal_with_start``."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import IntegrityError, transaction
from django.db.models import Model

from ..conf import weft_settings
from ..engine import codec
from ..engine.durations import Duration, parse_duration
from ..engine.errors import (
    InvalidInput,
    WorkflowAlreadyExists,
    WorkflowTerminalError,
)
from ..engine.records import (
    TERMINAL_STATUSES,
)
from ..engine.registry import Workflow, registry
from ..models import WorkflowRun
from ..models.runs import WORKFLOW_ID_MAX_LENGTH
from ..store import DjangoStore
from .dispatch import delivers, get_dispatcher
from .messages import SignalAccepted, _accepted, _encode_payload, _message_key, _message_name
from .operations import OPERATIONS
from .process import dispatch_on_commit, get_store
from .records import RunRecord

logger = logging.getLogger("django_weft.runtime")

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
    its runs."""

    id: str | None = None
    on_conflict: str = "use_existing"
    execution_timeout: Duration | None = None
    start_delay: Duration | None = None
    search_attributes: dict[str, Any] | None = None
    related_object: Model | None = None


@dataclass(frozen=True)
class _StartSpec:
    """A start request, validated and encoded: nothing is written until it is whole."""

    definition: Workflow[..., Any]
    fields: dict[str, Any]
    workflow_id: str | None
    on_conflict: str
    timeout: float | None
    delay: float | None


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
    return _StartSpec(
        definition=definition,
        fields={
            "workflow_name": definition.name,
            "workflow_version": definition.version,
            "args": args_value,
            "kwargs": kwargs_value,
            "search_attributes": attributes,
        },
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
) -> StartResult:
    """Create a run of ``workflow``, unowned and runnable (or ``pending`` with a delay).

    Everything is validated before anything is written. Idempotent by ``id``:
    ``use_existing`` (default) returns the latest run with that id if there is one,
    ``fail`` raises :class:`WorkflowAlreadyExists`, ``start_new_if_terminal`` returns a
    live run with that id or starts a new one when the latest has finished.
    """
    options = StartOptions(
        id=id,
        on_conflict=on_conflict,
        execution_timeout=execution_timeout,
        start_delay=start_delay,
        search_attributes=search_attributes,
        related_object=related_object,
    )
    return start_with(workflow, args, kwargs, options)


def start_with(
    workflow: str,
    args: list[Any] | tuple[Any, ...] | None,
    kwargs: dict[str, Any] | None,
    options: StartOptions,
) -> StartResult:
    """:func:`start` with its options in one :class:`StartOptions`."""
    spec = _prepare_start(workflow, args, kwargs, options)
    store = get_store()
    run_id = uuid.uuid4()
    if spec.workflow_id is None and spec.delay is None and spec.timeout is None:
        # Nothing to look up, nothing to compute from the database clock: one INSERT in
        # autocommit (the run's new id cannot conflict), then the doorbell.
        inserted = store.intake.insert_runnable_run(
            run_id, spec.fields, dispatched=delivers(get_dispatcher())
        )
        dispatch_on_commit(str(run_id))
        store.intake.announce_run_started(run_id, str(run_id), spec.definition.name)
        logger.info("run %s (%s %s): started", run_id, spec.definition.name, run_id)
        # ready_at is the database's now() expression here; the record does not show it.
        record = dataclasses.replace(RunRecord.of(inserted), ready_at=None)
        return StartResult(str(run_id), str(run_id), created=True, record=record)

    def find_or_create() -> StartResult:
        if spec.workflow_id is not None:
            existing = _existing_for_start(store, spec.workflow_id, spec.on_conflict)
            if existing is not None:
                return StartResult(
                    str(existing.pk), existing.workflow_id, created=False, record=RunRecord.of(existing)
                )
        run = _create_run(store, spec, run_id)
        return StartResult(str(run.pk), run.workflow_id, created=True)

    started = _atomic_retrying_id_conflicts(store, find_or_create, retry=spec.workflow_id is not None)
    if started.created:
        logger.info("run %s (%s %s): started", started.run_id, spec.definition.name, started.workflow_id)
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


def _create_run(store: DjangoStore, spec: _StartSpec, run_id: uuid.UUID) -> WorkflowRun:
    """Have the store insert the run (and its timers); ring its doorbell on commit. Runs
    inside the caller's transaction."""
    run, starts_at = store.intake.create_run(
        run_id,
        spec.workflow_id,
        spec.fields,
        timeout=spec.timeout,
        delay=spec.delay,
        dispatched=delivers(get_dispatcher()),
    )
    dispatch_on_commit(str(run.pk), eta=starts_at)
    store.intake.announce_run_started(run.pk, run.workflow_id, run.workflow_name)
    return run


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
    spec = _prepare_start(workflow, args, kwargs, options)
    name = _message_name(signal, "signal")
    key = _message_key(signal_id, "signal_id") if signal_id is not None else None
    value = _encode_payload(payload, f"the payload of signal {name}")
    store = get_store()
    dispatched = delivers(get_dispatcher())
    outcome = _atomic_retrying_id_conflicts(
        store, lambda: _signal_or_start(store, spec, id, name, value, key, dispatched)
    )
    logger.info(
        "run %s (%s): signal %s %s", outcome.run_id, outcome.workflow_id, name,
        "with a new run" if outcome.created else "received",
    )  # fmt: skip
    return outcome


def _signal_or_start(
    store: DjangoStore,
    spec: _StartSpec,
    workflow_id: str,
    name: str,
    value: Any,
    key: str | None,
    dispatched: bool,
) -> SignalWithStartResult:
    # The advisory lock of starts by id serialises concurrent signal_with_starts.
    run = _existing_for_start(store, workflow_id, spec.on_conflict)
    if run is not None:
        try:
            stored, duplicate, woken = store.intake.deliver_signal(
                run.pk, name, value, key, dispatched=dispatched
            )
        except WorkflowTerminalError:
            # It finished between the look-up and deliver_signal's row lock; nothing was
            # written, so a new run takes its place.
            run = None
    created = run is None
    if run is None:
        run = _create_run(store, spec, uuid.uuid4())
        stored, duplicate, woken = store.intake.deliver_signal(
            run.pk, name, value, key, dispatched=dispatched
        )
    if woken:
        dispatch_on_commit(str(run.pk))
    return SignalWithStartResult(str(run.pk), run.workflow_id, created, _accepted(stored, duplicate))
