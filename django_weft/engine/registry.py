"""Registration of workflows and activities by stable name."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from .declared_schedules import DeclaredSchedule
from .durations import Duration, parse_duration
from .errors import ConfigurationError, DuplicateRegistration, WorkflowArgumentsError, WorkflowNotRegistered
from .flow import Concurrency, Debounce, RateLimit, check_activity_concurrency
from .ports import get_starter
from .retention import RetentionValue, parse_override
from .retry import RetryPolicy

if TYPE_CHECKING:
    from .context import WorkflowContext

P = ParamSpec("P")
R = TypeVar("R")

MAX_NAME_LENGTH = 200


def _qualified_name(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def _check_name(name: str, kind: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"a {kind} name must be a non-empty string; got {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"{kind} name {name[:40]!r}... is {len(name)} characters; the limit is {MAX_NAME_LENGTH}"
        )
    return name


@dataclass(eq=False)
class Activity(Generic[P, R]):
    """A registered activity. Calling it outside a workflow just calls the function."""

    fn: Callable[P, R]
    name: str
    retry: RetryPolicy | None = None
    atomic: bool = False
    queue: str | None = None
    timeout: float | None = None
    rate_limit: RateLimit | None = None
    """The named rate limit its attempts share (flow control)."""
    concurrency: Concurrency | None = None
    """How many of its attempts execute at once, counted by key (flow control)."""
    marks_attempts: bool = False
    """Whether each inline attempt records that it started, and which worker runs it,
    before it runs (one more write), so an attempt lost with its worker is counted, and
    failed attempts name their worker: what a task of Django's task framework reports
    (``attempts``, ``worker_ids``). An attempt lost so is run again without using up the
    retry policy's attempts, up to :data:`~django_weft.engine.attempt.MAX_LOST_ATTEMPTS`."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    @property
    def flow_controlled(self) -> bool:
        """Whether an attempt must be let go by flow control before it runs."""
        return self.rate_limit is not None or self.concurrency is not None

    def __repr__(self) -> str:
        return f"<Activity {self.name}>"


@dataclass(eq=False)
class Workflow(Generic[P, R]):
    """A registered workflow. ``fn(ctx, *args, **kwargs)`` is the workflow body."""

    fn: Callable[..., R]
    name: str
    version: str = ""
    finalizer: Activity[..., Any] | None = None
    parameters: inspect.Signature | None = field(default=None, repr=False)
    schedules: tuple[DeclaredSchedule, ...] = ()
    """Schedules declared with the workflow (created by ``manage.py weft_schedules sync``)."""
    retention: dict[str, float | None] = field(default_factory=dict)
    """Its own retention periods in seconds, by terminal status or ``"default"``
    (:func:`~django_weft.engine.retention.parse_override`); empty: ``WEFT_RETENTION``'s."""
    concurrency: Concurrency | None = None
    """How many of its runs hold a slot at once, counted by key (flow control)."""
    debounce: Debounce | None = None
    """How its starts are collapsed into one run, by key (flow control)."""
    kind: str = "workflow"
    """``"workflow"``, or ``"task"`` for a task of Django's task framework run as a
    workflow (:mod:`django_weft.tasks`): what the admin's and the REST API's ``kind``
    filters tell apart."""

    def __call__(self, ctx: WorkflowContext, /, *args: Any, **kwargs: Any) -> R:
        return self.fn(ctx, *args, **kwargs)

    def start(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Start a run with these arguments (like Celery's ``delay``); returns its handle.

        Use :func:`django_weft.client.start` for options such as ``id`` or ``start_delay``.
        Raises :class:`WeftError` when no starter is installed (the app's ``ready()``
        installs one; see :func:`django_weft.engine.ports.set_starter`).
        """
        return get_starter()(self.name, args=list(args), kwargs=dict(kwargs))

    def check_arguments(self, args: list[Any] | tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise :class:`WorkflowArgumentsError` if ``fn(ctx, *args, **kwargs)`` could not be
        called: the start is refused at once instead of the run failing later."""
        signature = self.parameters or inspect.signature(self.fn, follow_wrapped=False)
        try:
            signature.bind(None, *args, **kwargs)  # None stands for ctx
        except TypeError as exc:
            shown = signature.replace(
                parameters=list(signature.parameters.values())[1:], return_annotation=inspect.Signature.empty
            )
            raise WorkflowArgumentsError(
                f"workflow {self.name!r} cannot be started with args={list(args)!r}, "
                f"kwargs={dict(kwargs)!r}: {exc}. Its parameters after ctx are {shown}",
                workflow=self.name,
            ) from None

    def __repr__(self) -> str:
        return f"<Workflow {self.name}>"


class Registry:
    """Workflows and activities by name. One process-wide instance: :data:`registry`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.workflows: dict[str, Workflow[..., Any]] = {}
        self.activities: dict[str, Activity[..., Any]] = {}

    def add_workflow(self, wf: Workflow[..., Any]) -> None:
        with self._lock:
            self._add(self.workflows, wf.name, wf, "workflow")

    def add_activity(self, act: Activity[..., Any]) -> None:
        with self._lock:
            self._add(self.activities, act.name, act, "activity")

    @staticmethod
    def _add(table: dict[str, Any], name: str, item: Any, kind: str) -> None:
        existing = table.get(name)
        # Re-importing the same module (autoreload, tests) registers the same function again.
        if existing is not None and _qualified_name(existing.fn) != _qualified_name(item.fn):
            raise DuplicateRegistration(
                f"{kind} name {name!r} is already registered by {_qualified_name(existing.fn)}; "
                f"{_qualified_name(item.fn)} cannot use it too. Give one of them another name="
            )
        table[name] = item

    def get_workflow(self, name: str) -> Workflow[..., Any]:
        try:
            return self.workflows[name]
        except KeyError:
            known = ", ".join(sorted(self.workflows)) or "none"
            raise WorkflowNotRegistered(
                f"no workflow is registered under the name {name!r} (registered: {known}). "
                "Check the name and that the module defining it is imported "
                "(an installed app's workflows.py is autodiscovered)",
                name=name,
            ) from None

    def workflow_names(self) -> frozenset[str]:
        """The names of the registered workflows (a snapshot)."""
        with self._lock:
            return frozenset(self.workflows)

    def workflow_names_of_kind(self, kind: str) -> frozenset[str]:
        """The names of the registered workflows of ``kind`` (``"workflow"`` or ``"task"``)."""
        with self._lock:
            return frozenset(name for name, wf in self.workflows.items() if wf.kind == kind)

    def concurrency_limits(self) -> dict[str, Concurrency]:
        """The registered workflows with a concurrency limit, by name (a snapshot)."""
        with self._lock:
            return {name: wf.concurrency for name, wf in self.workflows.items() if wf.concurrency is not None}

    def activity_concurrency_limits(self) -> dict[str, Concurrency]:
        """The registered activities with a concurrency limit, by name (a snapshot)."""
        with self._lock:
            return {
                name: act.concurrency for name, act in self.activities.items() if act.concurrency is not None
            }

    def rate_limit_names(self) -> frozenset[str]:
        """The names of the rate limits registered activities use (a snapshot)."""
        with self._lock:
            return frozenset(act.rate_limit.name for act in self.activities.values() if act.rate_limit)

    def rate_limits(self) -> dict[str, RateLimit]:
        """The rate limits registered activities use, by name (a snapshot; activities
        naming the same limit share its bucket, and the first registered gives its rate)."""
        with self._lock:
            limits: dict[str, RateLimit] = {}
            for act in self.activities.values():
                if act.rate_limit is not None:
                    limits.setdefault(act.rate_limit.name, act.rate_limit)
            return limits

    def activity_queues(self) -> frozenset[str]:
        """The queues the registered queued activities run on (a snapshot)."""
        with self._lock:
            return frozenset(act.queue for act in self.activities.values() if act.queue)

    def unregister(self, name: str) -> None:
        with self._lock:
            self.workflows.pop(name, None)
            self.activities.pop(name, None)


registry = Registry()


def workflow(
    fn: Callable[..., R] | None = None,
    *,
    name: str | None = None,
    version: str = "",
    finalizer: Activity[..., Any] | None = None,
    schedules: Sequence[DeclaredSchedule] = (),
    retention: RetentionValue = None,
    concurrency: Concurrency | None = None,
    debounce: Debounce | None = None,
) -> Any:
    """Register a workflow function ``fn(ctx, *args, **kwargs)``.

    Use bare (``@workflow``) or with options (``@workflow(name="orders.fulfil")``). The
    name defaults to ``module.qualname``; pick an explicit one so renaming or moving the
    function does not orphan running workflows. ``schedules`` declares recurring starts
    (:func:`django_weft.schedule`), created by ``manage.py weft_schedules sync``.
    ``retention`` keeps this workflow's finished runs for another period than
    ``WEFT_RETENTION``: a duration, or a dict by terminal status such as
    ``{"completed": "1d", "failed": "1y"}`` (``"default"`` for the statuses it does not
    name, ``None`` to keep forever); statuses it leaves out follow the setting.
    ``concurrency`` limits how many of its runs hold a slot at once
    (:class:`~django_weft.Concurrency`, docs/how-to/flow-control.md). ``debounce``
    collapses the starts with the same key that come within a period of each other into
    one run, started once they pause (:class:`~django_weft.Debounce`).
    """
    declared = tuple(schedules)
    if concurrency is not None and not isinstance(concurrency, Concurrency):
        raise ConfigurationError(f"concurrency= takes django_weft.Concurrency(...); got {concurrency!r}")
    if debounce is not None and not isinstance(debounce, Debounce):
        raise ConfigurationError(f"debounce= takes django_weft.Debounce(...); got {debounce!r}")
    for item in declared:
        if not isinstance(item, DeclaredSchedule):
            raise ConfigurationError(f"schedules= takes django_weft.schedule(...) declarations; got {item!r}")

    def decorate(func: Callable[..., R]) -> Workflow[..., R]:
        if not callable(func):
            raise ConfigurationError(f"@workflow decorates a function; got {func!r}")
        if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
            raise ConfigurationError(
                f"@workflow cannot decorate {_qualified_name(func)}: it is an async function. Workflow "
                "code is replayed, step by step, every time its run resumes, so it must be a plain "
                "function; put the async work in an async def @activity and call it with ctx.run"
            )
        wf_name = _check_name(name or _qualified_name(func), "workflow")
        wf: Workflow[..., R] = Workflow(
            fn=func,
            name=wf_name,
            version=version,
            finalizer=finalizer,
            # The function as called: a decorator's wrapper may take other arguments than
            # the function it wraps (functools.wraps sets __wrapped__).
            parameters=inspect.signature(func, follow_wrapped=False),
            schedules=declared,
            retention=parse_override(retention, what=f"the retention of workflow {wf_name!r}"),
            concurrency=concurrency,
            debounce=debounce,
        )
        wf.__doc__ = func.__doc__
        registry.add_workflow(wf)
        return wf

    return decorate(fn) if fn is not None else decorate


def activity(
    fn: Callable[P, R] | None = None,
    *,
    name: str | None = None,
    retry: RetryPolicy | None = None,
    atomic: bool = False,
    queue: str | None = None,
    timeout: Duration | None = None,
    rate_limit: RateLimit | None = None,
    concurrency: Concurrency | None = None,
) -> Any:
    """Register an activity: a function whose result a workflow records once.

    ``retry`` overrides ``WEFT_DEFAULT_RETRY_POLICY``. ``atomic=True`` runs the body in
    the same database transaction as its step record, so its ORM writes commit exactly
    once. ``queue`` and ``timeout`` are used by queued execution. ``rate_limit``
    (:class:`~django_weft.RateLimit`) paces its attempts by a named bucket shared with
    every activity naming it; ``concurrency`` (:class:`~django_weft.Concurrency`) limits
    how many of its attempts execute at once. An attempt over either waits, without a
    worker thread, and is never failed for it (docs/how-to/flow-control.md).

    An ``async def`` function works too, inline and queued: each attempt runs its
    coroutine to the end on an event loop of its own in the executing thread. It cannot
    be ``atomic`` (``ConfigurationError``).
    """
    if rate_limit is not None and not isinstance(rate_limit, RateLimit):
        raise ConfigurationError(
            f"@activity(rate_limit=...) takes django_weft.RateLimit(...); got {rate_limit!r}"
        )
    if concurrency is not None and not isinstance(concurrency, Concurrency):
        raise ConfigurationError(
            f"@activity(concurrency=...) takes django_weft.Concurrency(...); got {concurrency!r}"
        )

    def decorate(func: Callable[P, R]) -> Activity[P, R]:
        if not callable(func):
            raise ConfigurationError(f"@activity decorates a function; got {func!r}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigurationError(f"@activity(retry=...) takes a RetryPolicy; got {retry!r}")
        if atomic and inspect.iscoroutinefunction(func):
            raise ConfigurationError(
                f"@activity(atomic=True) cannot decorate {_qualified_name(func)}: it is an async "
                "function, and a database transaction cannot span it (Django's ORM is sync-only, and "
                "async code reaches it through other threads, outside the step's transaction). Make "
                "it a plain function, or drop atomic=True and make its writes idempotent with "
                "activity_info().idempotency_key"
            )
        act_name = _check_name(name or _qualified_name(func), "activity")
        act: Activity[P, R] = Activity(
            fn=func,
            name=act_name,
            retry=retry,
            atomic=atomic,
            queue=queue,
            timeout=parse_duration(timeout, what="activity timeout") if timeout is not None else None,
            rate_limit=rate_limit,
            concurrency=check_activity_concurrency(concurrency, act_name)
            if concurrency is not None
            else None,
        )
        act.__doc__ = func.__doc__
        registry.add_activity(act)
        return act

    return decorate(fn) if fn is not None else decorate


ActivityAdapter = Callable[[Any], "Activity[..., Any] | None"]
"""Turns something ``ctx.run`` is given into the :class:`Activity` that runs it, or says
``None`` (not one of its kind)."""

_adapters: list[ActivityAdapter] = []


def register_activity_adapter(adapter: ActivityAdapter) -> None:
    """Let ``ctx.run`` take more than activities and callables: ``adapter`` is asked first
    (the task framework's tasks are run so, by :mod:`django_weft.tasks`). Idempotent."""
    if adapter not in _adapters:
        _adapters.append(adapter)


def as_activity(target: Activity[..., Any] | Callable[..., Any]) -> Activity[..., Any]:
    """The :class:`Activity` for ``target``; plain callables get default options."""
    if isinstance(target, Activity):
        return target
    for adapter in _adapters:
        adapted = adapter(target)
        if adapted is not None:
            return adapted
    if isinstance(target, Workflow):
        raise ConfigurationError(f"{target.name} is a workflow; run it as a child workflow, not with ctx.run")
    if not callable(target):
        raise ConfigurationError(f"ctx.run takes an activity or a callable; got {target!r}")
    return Activity(fn=target, name=_qualified_name(target))
