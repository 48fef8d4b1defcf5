"""Retry policies for activities."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from .durations import Duration, parse_duration
from .errors import ConfigurationError, InvalidDuration


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how fast a failing activity is retried.

    ``max_attempts`` counts the first attempt: ``RetryPolicy(max_attempts=1)`` means no
    retries. The wait before attempt ``n + 1`` is ``initial_interval * backoff ** (n - 1)``
    capped at ``max_interval``. Exceptions that are instances of a type in
    ``non_retryable`` fail the activity at once.
    """

    max_attempts: int = 3
    initial_interval: Duration = 1.0
    backoff: float = 2.0
    max_interval: Duration = 60.0
    non_retryable: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigurationError(
                f"RetryPolicy.max_attempts must be an integer >= 1; got {self.max_attempts!r}"
            )
        if self.backoff < 1:
            raise ConfigurationError(f"RetryPolicy.backoff must be >= 1; got {self.backoff!r}")
        for name in ("initial_interval", "max_interval"):
            try:
                seconds = parse_duration(getattr(self, name), what=f"RetryPolicy.{name}")
            except InvalidDuration as exc:
                raise ConfigurationError(str(exc)) from None
            object.__setattr__(self, name, seconds)
        object.__setattr__(self, "non_retryable", tuple(self.non_retryable))

    def delay_after(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        # __post_init__ normalised both intervals to seconds.
        delay = cast(float, self.initial_interval) * (self.backoff ** (attempt - 1))
        return min(delay, cast(float, self.max_interval))

    def is_retryable(self, error: BaseException) -> bool:
        return not isinstance(error, self.non_retryable)

    @classmethod
    def coerce(cls, value: RetryPolicy | dict[str, Any] | None) -> RetryPolicy:
        if value is None:
            return cls()
        if isinstance(value, RetryPolicy):
            return value
        if isinstance(value, dict):
            return cls(**value)
        raise ConfigurationError(
            f"a retry policy must be a RetryPolicy or a dict of its fields; got {type(value).__name__}"
        )
