"""Flow control's declarations and their arithmetic: a concurrency limit
(:class:`Concurrency`, on a workflow or an activity) and the key it is counted by, a
start's priority, the debounce of a workflow's starts (:class:`Debounce`), an
activity's rate limit (:class:`RateLimit`, its ``"50/s"`` form and the GCRA that paces
it), and what a held activity attempt waits for (:class:`Hold`).

Nothing here touches a database: the store counts slots, queues runs and collapses
debounced starts under a lock of the key, and advances a rate limit's bucket in one
statement (docs/explanation/flow-control.md says how, and what each choice means).
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from .codec import text_flaw
from .durations import Duration, parse_duration
from .errors import ConfigurationError, InvalidDuration, InvalidInput

PRIORITY_MIN = -100
PRIORITY_MAX = 100
"""Priorities run from -100 to 100, higher first, 0 by default (Django's tasks use the
same range)."""

KEY_MAX_LENGTH = 200
"""The longest concurrency or debounce key kept on a run (the columns hold 255)."""

QUEUED_REASON = "concurrency"
"""``waiting_on["kind"]`` of a run queued for a concurrency slot."""

DEBOUNCED_REASON = "debounce"
"""``waiting_on["kind"]`` of a debounced run waiting for its burst of starts to pause."""


class OnLimit(enum.StrEnum):
    """What a start does when its key's slots are all taken."""

    QUEUE = "queue"
    """The run waits (status ``pending``) until a slot frees; the default."""
    CANCEL_RUNNING = "cancel_running"
    """The oldest run holding a slot of the key is cancelled; the new run takes its slot."""
    CANCEL_NEW = "cancel_new"
    """The start is refused with :class:`ConcurrencyLimited`; nothing is written."""
    SKIP = "skip"
    """The start returns the run holding the key (the oldest): a singleton per key."""


class Scope(enum.StrEnum):
    """What ``limit`` counts."""

    KEY = "key"
    """Each key has ``limit`` slots of its own (with ``key=None``: one limit for the workflow)."""
    WORKFLOW = "workflow"
    """The workflow has ``limit`` slots in all; the key decides only whose turn it is: slots
    go round-robin across the keys that wait."""


ConcurrencyKey = Callable[..., Any]


@dataclass(frozen=True)
class Concurrency:
    """How many runs of a workflow hold a slot at once (``@workflow(concurrency=...)``),
    or how many attempts of an activity execute at once (``@activity(concurrency=...)``,
    with ``key`` a function of the activity's arguments; ``on_limit="queue"`` and
    ``scope="key"`` only: :func:`check_activity_concurrency`).

    A run takes a slot when its first turn is claimed and keeps it while it waits or
    sleeps, until it ends. ``key`` is a function of the start's arguments (the same
    ``*args, **kwargs`` the workflow takes after ``ctx``) returning the key the limit is
    counted by, or ``None`` for one limit for the whole workflow; it is computed once, at
    start, and stored on the run. ``on_limit`` says what a start does when the key's
    slots are taken (:class:`OnLimit`). ``scope="workflow"`` makes ``limit`` the
    workflow's total, shared round-robin by the keys that wait.
    """

    limit: int
    key: ConcurrencyKey | None = None
    on_limit: str = OnLimit.QUEUE
    scope: str = Scope.KEY

    def __post_init__(self) -> None:
        limit = self.limit
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 2**31 - 1:
            raise ConfigurationError(
                f"Concurrency(limit=...) takes a whole number of slots of at least 1; got {self.limit!r}"
            )
        if self.key is not None and not callable(self.key):
            raise ConfigurationError(
                "Concurrency(key=...) takes a function of the start's arguments returning the key "
                "(for example lambda customer_id, **_: f'customer-{customer_id}'), "
                f"or None; got {self.key!r}"
            )
        if self.on_limit not in OnLimit.__members__.values():
            raise ConfigurationError(
                f"Concurrency(on_limit=...) must be one of {', '.join(OnLimit)}; got {self.on_limit!r}"
            )
        if self.scope not in Scope.__members__.values():
            raise ConfigurationError(
                f"Concurrency(scope=...) must be one of {', '.join(Scope)}; got {self.scope!r}"
            )
        if self.scope == Scope.WORKFLOW and self.on_limit != OnLimit.QUEUE:
            raise ConfigurationError(
                "Concurrency(scope='workflow') shares the workflow's slots across keys and takes "
                f"on_limit='queue' only; got on_limit={self.on_limit!r}"
            )

    def key_of(self, workflow: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The key of a start with these arguments: ``""`` for one limit for the workflow.
        Raises :class:`InvalidInput` saying what went wrong."""
        return key_text(
            self.key, args, kwargs, what="concurrency key", owner=f"of workflow {workflow!r}",
            source="the start's arguments",
        )  # fmt: skip

    @property
    def per_workflow(self) -> bool:
        return self.scope == Scope.WORKFLOW

    def describe(self) -> dict[str, Any]:
        return {"limit": self.limit, "on_limit": str(self.on_limit), "scope": str(self.scope),
                "keyed": self.key is not None}  # fmt: skip


def _configured_duration(value: Any, what: str) -> float:
    try:
        return parse_duration(value, what=what)
    except InvalidDuration as exc:
        raise ConfigurationError(exc.message) from None


@dataclass(frozen=True)
class Debounce:
    """Starts of a workflow collapsed into one run (``@workflow(debounce=...)``).

    Starts with the same key, each within ``period`` of the one before, are one *burst*:
    one run, which starts ``period`` after the last of them, with the last one's
    arguments. ``max_wait`` (a duration, at least ``period``) caps the wait, counted from
    the burst's first start, so a stream of starts that never pauses still starts a run
    every ``max_wait``; ``None`` (the default) waits for the pause however long it takes.
    ``key`` is a function of the start's arguments (as :class:`Concurrency`'s), or
    ``None`` for one burst per workflow; it is computed at each start.
    """

    period: Duration
    max_wait: Duration | None = None
    key: ConcurrencyKey | None = None
    period_seconds: float = field(init=False, repr=False, compare=False)
    max_wait_seconds: float | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        period = _configured_duration(self.period, "Debounce(period=...)")
        if period <= 0:
            raise ConfigurationError(
                "Debounce(period=...) is how long a start waits for the next one, and must be longer "
                f"than 0 seconds (write e.g. '30s'); got {self.period!r}"
            )
        max_wait = None
        if self.max_wait is not None:
            max_wait = _configured_duration(self.max_wait, "Debounce(max_wait=...)")
            if max_wait < period:
                raise ConfigurationError(
                    f"Debounce(max_wait=...) caps the wait of a burst of starts and must be at least "
                    f"its period ({period:g} s), or None for no cap; got {self.max_wait!r}"
                )
        if self.key is not None and not callable(self.key):
            raise ConfigurationError(
                "Debounce(key=...) takes a function of the start's arguments returning the key "
                "(for example lambda index, **_: index), or None for one burst per workflow; "
                f"got {self.key!r}"
            )
        object.__setattr__(self, "period_seconds", period)
        object.__setattr__(self, "max_wait_seconds", max_wait)

    def key_of(self, workflow: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The debounce key of a start with these arguments: ``""`` for one burst per
        workflow. Raises :class:`InvalidInput` saying what went wrong (the start is refused)."""
        return key_text(
            self.key, args, kwargs, what="debounce key", owner=f"of workflow {workflow!r}",
            source="the start's arguments",
        )  # fmt: skip

    def starts_at(self, first: datetime, now: datetime) -> datetime:
        """When the run of a burst that began at ``first`` starts, given a start at ``now``:
        ``period`` after ``now``, and no later than ``max_wait`` after ``first``."""
        moment = now + timedelta(seconds=self.period_seconds)
        if self.max_wait_seconds is not None:
            moment = min(moment, first + timedelta(seconds=self.max_wait_seconds))
        return moment


def queued_reason(key: str, limit: int, in_use: int, *, per_workflow: bool) -> dict[str, Any]:
    """``waiting_on`` of a run queued for a slot: what it waits for, in words and fields."""
    scope = "the workflow" if per_workflow or not key else f"key {key}"
    return {
        "kind": QUEUED_REASON,
        "key": key,
        "limit": limit,
        "in_use": in_use,
        "text": f"queued: concurrency {scope} ({in_use} of {limit} in use)",
    }


def debounced_reason(key: str, starts_at: datetime, first_start_at: datetime, starts: int) -> dict[str, Any]:
    """``waiting_on`` of a debounced run: when it starts (UTC), when its burst began, and
    how many starts it collapsed so far, in words and fields."""
    starts_at = starts_at.astimezone(UTC)
    return {
        "kind": DEBOUNCED_REASON,
        "key": key,
        "starts_at": starts_at.isoformat(),
        "first_start_at": first_start_at.astimezone(UTC).isoformat(),
        "starts": starts,
        "text": debounced_text(f"{starts_at:%H:%M:%S}", starts),
    }


def debounced_text(starts_at: str, starts: int) -> str:
    """A debounced run's wait in words: ``debounced: starts at 14:05:07 (3 starts collapsed)``."""
    collapsed = "1 start" if starts == 1 else f"{starts} starts collapsed"
    return f"debounced: starts at {starts_at} ({collapsed})"


def key_text(
    function: ConcurrencyKey | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    what: str,
    owner: str,
    source: str,
) -> str:
    """The key ``function(*args, **kwargs)`` returns, as stored: ``""`` without a function.

    ``what`` and ``owner`` name it in errors ("concurrency key", "of workflow 'x'"),
    ``source`` the arguments it was given. Raises :class:`InvalidInput` when the function
    raises, or returns something other than a str or an int, an empty key, a control
    character or more than 200 characters: arguments it cannot make a key of are as much
    the caller's to fix as the function's."""
    if function is None:
        return ""
    try:
        value = function(*args, **kwargs)
    except Exception as exc:
        raise InvalidInput(
            f"the {what} {owner} could not be computed from {source}: {type(exc).__name__}: {exc}",
            field="args",
        ) from None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidInput(
            f"the {what} function {owner} must return a str or int; it returned {type(value).__name__}",
            field="args",
        )
    text = str(value)
    flaw = text_flaw(text)
    reason = None
    if flaw is not None:
        reason = f"holds {flaw}"
    elif not text:
        reason = "is empty"
    elif len(text) > KEY_MAX_LENGTH:
        reason = f"is {len(text)} characters (at most {KEY_MAX_LENGTH})"
    if reason is not None:
        raise InvalidInput(f"the {what} {owner} for these arguments {reason}", field="args")
    return text


def check_activity_concurrency(limit: Concurrency, activity: str) -> Concurrency:
    """An activity's concurrency limit, refused unless it can apply to attempts: an
    attempt over the limit waits for a slot (``on_limit="queue"``), and each key has its
    own slots (``scope="key"``)."""
    if limit.on_limit != OnLimit.QUEUE:
        raise ConfigurationError(
            f"@activity(concurrency=...) of {activity!r}: an activity attempt over the limit waits for a "
            f"slot, so on_limit must be 'queue' (the default); got on_limit={limit.on_limit!r}. "
            "Refusing or replacing work is decided when a workflow starts: put that limit on the workflow"
        )
    if limit.scope != Scope.KEY:
        raise ConfigurationError(
            f"@activity(concurrency=...) of {activity!r}: scope='workflow' shares a workflow's run slots "
            "round-robin across keys and does not apply to activity attempts; leave scope='key' (the "
            "default), where each key has limit slots of its own"
        )
    return limit


# -- rate limits ---------------------------------------------------------------------------

RATE_LIMIT_NAME_MAX_LENGTH = 100
"""The longest rate limit name (a key of ``WEFT_RATE_LIMITS`` too)."""

START_GRACE_MIN = 0.020
"""The least time, in seconds, an attempt may start after its moment (see
:func:`reservation_stands`): a worker's wake-up takes a few milliseconds."""

RATE_LIMIT_BURST = 1
"""How many attempts of one bucket may go at once after a quiet period: one (what
:func:`gcra_take` gives). The next goes ``per / limit`` after it, and so on, so that no
window of length ``per`` holds more than ``limit`` attempts let go
(docs/how-to/flow-control.md, "Rate limits")."""

_RATE = re.compile(r"^\s*(?P<limit>\d+)\s*/\s*(?P<per>[^/]+?)\s*$")


@dataclass(frozen=True)
class Rate:
    """``limit`` attempts per ``per`` seconds, paced: one every ``per / limit``."""

    limit: int
    per: float

    @property
    def interval_us(self) -> int:
        """The emission interval in microseconds, rounded up: the limit is never exceeded
        by rounding (3 per second is one per 333,334 µs)."""
        return max(1, math.ceil(self.per * 1_000_000 / self.limit))

    def __str__(self) -> str:
        return f"{self.limit}/{self.per:g}s"


def check_rate(limit: Any, per: Any, *, what: str) -> Rate:
    """``limit`` per ``per`` checked: a whole number of at least 1 per a positive duration."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 2**31 - 1:
        raise ConfigurationError(f"{what}: limit must be a whole number of at least 1; got {limit!r}")
    try:
        seconds = parse_duration(per, what=f"{what}: per")
    except InvalidDuration as exc:
        raise ConfigurationError(str(exc)) from None
    if seconds <= 0:
        raise ConfigurationError(f"{what}: per must be a positive duration such as '1s' or '1m'; got {per!r}")
    return Rate(limit, seconds)


def parse_rate(value: Any, *, what: str) -> Rate:
    """A rate written ``"<limit>/<period>"``: ``"50/s"`` (50 per second), ``"600/m"``,
    ``"10/5s"`` (10 per 5 seconds), ``"1000/1h30m"``. The period is a unit alone (one of
    it: ``s``, ``m``, ``h``, ``d``, ``w``, ``ms`` or their long names) or a duration
    (:func:`~django_weft.engine.durations.parse_duration`). Raises
    :class:`ConfigurationError` saying what to write instead."""
    forms = "write '<limit>/<period>', for example '50/s', '600/m' or '10/5s'"
    if not isinstance(value, str):
        raise ConfigurationError(f"{what} must be a string; {forms}; got {value!r}")
    match = _RATE.match(value)
    if match is None:
        raise ConfigurationError(f"{what} is {value!r}; {forms}")
    per = match.group("per")
    if per.isalpha():
        per = f"1{per}"  # "50/s": one second
    return check_rate(int(match.group("limit")), per, what=f"{what} ({value!r})")


def parse_rate_limits(value: Any, *, what: str = "WEFT_RATE_LIMITS") -> dict[str, Rate]:
    """``WEFT_RATE_LIMITS``: a dict from rate limit names to rates (:func:`parse_rate`),
    or ``None`` for none. Raises :class:`ConfigurationError` naming the bad entry."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"{what} must be a dict from rate limit names to rates, for example {{'stripe': '50/s'}}; "
            f"got {type(value).__name__}"
        )
    rates = {}
    for name, rate in value.items():
        if not isinstance(name, str) or not name.strip() or len(name) > RATE_LIMIT_NAME_MAX_LENGTH:
            raise ConfigurationError(
                f"{what} has the key {name!r}; a key is the name of a RateLimit (a non-empty string of at "
                f"most {RATE_LIMIT_NAME_MAX_LENGTH} characters)"
            )
        rates[name] = parse_rate(rate, what=f"{what}[{name!r}]")
    return rates


@dataclass(frozen=True)
class RateLimit:
    """A named rate limit on an activity's attempts (``@activity(rate_limit=...)``).

    Every activity naming the same ``name`` shares its bucket, across every worker
    process. ``limit`` attempts per ``per`` (a duration: ``"1s"``, ``60``), paced one
    every ``per / limit``; ``WEFT_RATE_LIMITS = {name: "50/s"}`` overrides both. With
    ``key``, a function of the activity's arguments, each key has a bucket of its own.
    An attempt over the limit is delayed to the moment the limit allows it, never
    dropped or failed (docs/how-to/flow-control.md, "Rate limits").
    """

    name: str
    limit: int
    per: Duration
    key: ConcurrencyKey | None = None
    _rate: Rate = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name.strip():
            raise ConfigurationError(f"RateLimit(name=...) must be a non-empty string; got {name!r}")
        flaw = text_flaw(name)
        if flaw is not None or len(name) > RATE_LIMIT_NAME_MAX_LENGTH:
            raise ConfigurationError(
                f"RateLimit(name={name[:40]!r}) must be at most {RATE_LIMIT_NAME_MAX_LENGTH} characters "
                "without control characters"
            )
        rate = check_rate(self.limit, self.per, what=f"RateLimit({name!r})")
        object.__setattr__(self, "per", rate.per)
        object.__setattr__(self, "_rate", rate)
        if self.key is not None and not callable(self.key):
            raise ConfigurationError(
                "RateLimit(key=...) takes a function of the activity's arguments returning the key "
                f"(for example lambda account_id, **_: account_id), or None; got {self.key!r}"
            )

    def rate(self, overrides: Mapping[str, Rate]) -> Rate:
        """Its rate: ``WEFT_RATE_LIMITS``' for its name if it has one (``overrides``),
        else its own."""
        return overrides.get(self.name) or self._rate

    def key_of(self, activity: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The bucket key of an attempt with these arguments (``""``: the one bucket)."""
        return key_text(
            self.key, args, kwargs, what="rate limit key", owner=f"of activity {activity!r}",
            source="the activity's arguments",
        )  # fmt: skip


def activity_flow_keys(
    activity: str,
    rate_limit: RateLimit | None,
    concurrency: Concurrency | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> tuple[str, str]:
    """``(rate limit key, concurrency key)`` of an attempt of ``activity`` with these
    arguments (``""``: not keyed). Raises as :func:`key_text` does."""
    rate_key = rate_limit.key_of(activity, args, kwargs) if rate_limit is not None else ""
    slot_key = ""
    if concurrency is not None:
        slot_key = key_text(
            concurrency.key, args, kwargs, what="concurrency key", owner=f"of activity {activity!r}",
            source="the activity's arguments",
        )  # fmt: skip
    return rate_key, slot_key


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_micros(moment: datetime) -> int:
    """A bucket's time: microseconds since the epoch."""
    return (moment - _EPOCH) // timedelta(microseconds=1)


def from_micros(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


def gcra_take(tat_us: int | None, now_us: int, rate: Rate) -> tuple[int, int]:
    """Take the next moment of a bucket (a generic cell rate algorithm, as a reservation,
    with a burst of one): return ``(new tat, moment)``, in microseconds since the epoch.

    ``tat`` (theoretical arrival time) is when the bucket's next attempt is due (``None``:
    a new bucket). The attempt goes at ``moment``: now, or ``tat`` when the attempts
    before it took the moments up to then; the bucket moves one interval past it. Every
    call takes a moment, so attempts held back queue in the order they came, each with a
    moment of its own, one interval apart. The store runs the same arithmetic in one
    statement (:func:`gcra_moment` reads its result)."""
    moment = now_us if tat_us is None else max(tat_us, now_us)
    return moment + rate.interval_us, moment


def start_grace(rate: Rate) -> float:
    """How long after its moment an attempt may still start, in seconds: half an
    interval, and at least :data:`START_GRACE_MIN`."""
    return max(rate.interval_us / 2_000_000, START_GRACE_MIN)


def reservation_stands(moment: datetime | None, now: datetime, rate: Rate) -> bool:
    """Whether an attempt that was given ``moment`` may start on it at ``now``.

    Not when it comes later than :func:`start_grace` after it (its worker was busy):
    started then, it would run beside the attempts given the next moments, so it takes
    a new moment instead. That keeps the starts, not only the moments, to the limit: no
    window of length ``per`` holds more than ``limit`` moments, so no more than ``limit``
    + 1 starts while the grace is half an interval (docs/explanation/flow-control.md)."""
    return moment is not None and (now - moment).total_seconds() <= start_grace(rate)


def gcra_moment(new_tat_us: int, rate: Rate) -> int:
    """The moment of the attempt that moved a bucket to ``new_tat_us`` (what
    :func:`gcra_take` returns beside it)."""
    return new_tat_us - rate.interval_us


# -- held attempts -------------------------------------------------------------------------


class HoldKind(enum.StrEnum):
    """Why an activity attempt waits (``waiting_on["kind"]`` of a run parked on it)."""

    RATE_LIMIT = "rate_limit"
    """Delayed to the moment its rate limit allows it."""
    CONCURRENCY = "activity_concurrency"
    """Queued for a slot of its activity's concurrency limit."""


HOLD_KINDS = frozenset(HoldKind)


@dataclass(frozen=True)
class Hold:
    """An activity attempt held by flow control: recorded as the result of its step
    (status ``delayed``), and for an inline activity as its run's ``waiting_on``.

    ``until`` is the moment its rate limit allows it, or for a concurrency hold when it
    looks again for a slot (a freed slot wakes it sooner). ``reserved``: the rate limit
    moment the attempt was given, which it starts on without taking another (unless it
    comes too late for it: :func:`reservation_stands`)."""

    kind: str
    activity: str
    until: datetime
    key: str = ""
    name: str = ""
    """The rate limit's name (a rate limit hold)."""
    limit: int = 0
    in_use: int = 0
    reserved: datetime | None = None

    @property
    def text(self) -> str:
        keyed = f" key {self.key}" if self.key else ""
        if self.kind == HoldKind.RATE_LIMIT:
            moment = self.until.astimezone(UTC)
            return (
                f"delayed by rate limit {self.name}{keyed} until "
                f"{moment:%H:%M:%S}.{moment.microsecond // 1000:03d}"
            )
        return f"queued: activity concurrency {self.activity}{keyed} ({self.in_use} of {self.limit} in use)"

    def as_result(self) -> dict[str, Any]:
        """The ``delayed`` step's result."""
        fields: dict[str, Any] = {"kind": self.kind, "until": self.until.isoformat(), "key": self.key}
        if self.kind == HoldKind.RATE_LIMIT:
            fields["name"] = self.name
        else:
            fields.update(limit=self.limit, in_use=self.in_use)
        if self.reserved is not None:
            fields["reserved"] = self.reserved.isoformat()
        fields["text"] = self.text
        return fields

    def waiting_on(self, seq: int) -> dict[str, Any]:
        """The ``waiting_on`` of a run parked on this hold (an inline activity)."""
        return {**self.as_result(), "seq": seq, "activity": self.activity, "fire_at": self.until.isoformat()}

    @classmethod
    def of(cls, result: Mapping[str, Any], activity: str) -> Hold:
        """The hold a ``delayed`` step's result records."""
        return cls(
            kind=str(result.get("kind") or HoldKind.RATE_LIMIT),
            activity=activity,
            until=datetime.fromisoformat(str(result["until"])),
            key=str(result.get("key") or ""),
            name=str(result.get("name") or ""),
            limit=int(result.get("limit") or 0),
            in_use=int(result.get("in_use") or 0),
            reserved=reserved_moment(result),
        )


@dataclass(frozen=True)
class SlotTaken:
    """What asking for an activity concurrency slot decided: ``held`` (the attempt may
    run), else it is queued for one; ``in_use`` is how many slots of the key were taken."""

    held: bool
    in_use: int


def reserved_moment(result: Any) -> datetime | None:
    """The rate limit moment a ``delayed`` or ``scheduled`` step's result records."""
    raw = result.get("reserved") if isinstance(result, Mapping) else None
    try:
        return datetime.fromisoformat(raw) if isinstance(raw, str) else None
    except ValueError:
        return None


def hold_is_due(result: Any, now: datetime) -> bool:
    """Whether a ``delayed`` step's hold is over at ``now``: its run needs a turn."""
    try:
        return datetime.fromisoformat(str(result["until"])) <= now
    except (KeyError, TypeError, ValueError):
        return True  # unreadable: let the run's turn look at it
