"""The ``WEFT_*`` settings, with their defaults, read live from ``django.conf.settings``.

Reading is live so ``override_settings`` works: a value read once is kept until Django
puts other settings in place (``override_settings`` and pytest-django's ``settings``
fixture do) or says a setting changed (``setting_changed``). ``docs/reference/settings.md`` documents
each setting.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, cast

from django.apps import apps
from django.conf import settings as django_settings
from django.core.signals import setting_changed

from .engine.durations import parse_duration
from .engine.executor import EngineConfig
from .engine.flow import Rate, parse_rate_limits
from .engine.records import RunStatus
from .engine.retention import DEFAULT_RETENTION, parse_retention
from .engine.retry import RetryPolicy

DEFAULTS: dict[str, Any] = {
    "WEFT_AUTODISCOVER_MODULE": "workflows",
    "WEFT_LEASE_TTL": 30.0,
    "WEFT_LEASE_RENEW_INTERVAL": 5.0,
    "WEFT_TAKEOVER_GRACE": None,  # None: 2 x WEFT_LEASE_RENEW_INTERVAL
    "WEFT_TICK_INTERVAL": 1.0,
    "WEFT_TICK_BATCH": 100,
    "WEFT_REDISPATCH_AFTER": 15.0,
    "WEFT_DISPATCHER": None,  # None: Celery's with django_weft.contrib.celery installed, else sweep-only
    "WEFT_CELERY_QUEUE": None,  # None: Celery's own routing (the default queue)
    "WEFT_MAX_PAYLOAD_BYTES": 1024 * 1024,
    "WEFT_API_PERMISSION_CLASSES": None,  # None: authenticated staff with model permissions
    "WEFT_API_RUN_FILTER": None,  # None: every run is visible to whoever may view runs
    "WEFT_API_MAX_WAIT": 30.0,
    "WEFT_API_MAX_BODY_BYTES": None,  # None: WEFT_MAX_PAYLOAD_BYTES plus 64 KiB of envelope
    "WEFT_DATABASE_ALIAS": "default",
    "WEFT_READ_DATABASE": None,  # None: WEFT_DATABASE_ALIAS
    "WEFT_RETENTION": DEFAULT_RETENTION,
    "WEFT_DEFAULT_RETRY_POLICY": None,
    "WEFT_RETRY_INLINE_MAX_DELAY": 2.0,
    "WEFT_PREPARE_STATEMENTS": True,
    "WEFT_RATE_LIMITS": {},
    "WEFT_NOTIFY": True,
    "WEFT_WORKER_GC_FREEZE": True,
    "WEFT_TRACING": False,
    "WEFT_METRICS": False,
    "WEFT_METRICS_SAMPLE_INTERVAL": 15.0,
}


_read: dict[str, tuple[Any, Any]] = {}
"""The settings read so far: by name, the settings object it was read from and the value.
A setting that is not set costs Django's settings an ``AttributeError`` on every look-up,
and the store looks some up for every step."""


_ENGINE_CONFIG = "engine config"
"""Where :meth:`WeftSettings.engine_config` keeps its parsed settings in ``_read``."""


def _forget(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith("WEFT_"):
        _read.clear()


setting_changed.connect(_forget, dispatch_uid="django_weft.conf.forget")


class WeftSettings:
    """Typed, live access to the ``WEFT_*`` settings."""

    def _get(self, name: str) -> Any:
        # override_settings (and pytest-django's settings fixture, even to delete one)
        # puts a new settings object in place: what was read from another one is stale.
        holder = getattr(django_settings, "_wrapped", None)
        found = _read.get(name)
        if found is not None and found[0] is holder:
            return found[1]
        value = getattr(django_settings, name, DEFAULTS[name])
        _read[name] = (holder, value)
        return value

    @property
    def AUTODISCOVER_MODULE(self) -> str | None:
        return self._get("WEFT_AUTODISCOVER_MODULE")

    @property
    def LEASE_TTL(self) -> float:
        return parse_duration(self._get("WEFT_LEASE_TTL"), what="WEFT_LEASE_TTL")

    @property
    def LEASE_RENEW_INTERVAL(self) -> float:
        return parse_duration(self._get("WEFT_LEASE_RENEW_INTERVAL"), what="WEFT_LEASE_RENEW_INTERVAL")

    @property
    def TAKEOVER_GRACE(self) -> float:
        value = self._get("WEFT_TAKEOVER_GRACE")
        if value is None:
            return 2 * self.LEASE_RENEW_INTERVAL
        return parse_duration(value, what="WEFT_TAKEOVER_GRACE")

    @property
    def TICK_INTERVAL(self) -> float:
        return parse_duration(self._get("WEFT_TICK_INTERVAL"), what="WEFT_TICK_INTERVAL")

    @property
    def METRICS(self) -> bool:
        return bool(self._get("WEFT_METRICS"))

    @property
    def METRICS_SAMPLE_INTERVAL(self) -> float:
        return parse_duration(self._get("WEFT_METRICS_SAMPLE_INTERVAL"), what="WEFT_METRICS_SAMPLE_INTERVAL")

    @property
    def TICK_BATCH(self) -> int:
        return int(self._get("WEFT_TICK_BATCH"))

    @property
    def REDISPATCH_AFTER(self) -> float:
        return parse_duration(self._get("WEFT_REDISPATCH_AFTER"), what="WEFT_REDISPATCH_AFTER")

    @property
    def DISPATCHER(self) -> str:
        value = self._get("WEFT_DISPATCHER")
        if value is not None:
            return str(value)
        if apps.is_installed("django_weft.contrib.celery"):
            return "django_weft.contrib.celery.dispatch.CeleryDispatcher"
        return "django_weft.runtime.dispatch.SweepOnlyDispatcher"

    @property
    def NOTIFY(self) -> bool:
        return bool(self._get("WEFT_NOTIFY"))

    @property
    def WORKER_GC_FREEZE(self) -> bool:
        return bool(self._get("WEFT_WORKER_GC_FREEZE"))

    @property
    def TRACING(self) -> bool:
        return bool(self._get("WEFT_TRACING"))

    @property
    def CELERY_QUEUE(self) -> str | None:
        return self._get("WEFT_CELERY_QUEUE")

    @property
    def MAX_PAYLOAD_BYTES(self) -> int:
        return int(self._get("WEFT_MAX_PAYLOAD_BYTES"))

    @property
    def API_PERMISSION_CLASSES(self) -> list[str] | None:
        value = self._get("WEFT_API_PERMISSION_CLASSES")
        return None if value is None else list(value)

    @property
    def API_RUN_FILTER(self) -> str | None:
        return self._get("WEFT_API_RUN_FILTER")

    @property
    def API_MAX_WAIT(self) -> float:
        return parse_duration(self._get("WEFT_API_MAX_WAIT"), what="WEFT_API_MAX_WAIT")

    @property
    def API_MAX_BODY_BYTES(self) -> int:
        value = self._get("WEFT_API_MAX_BODY_BYTES")
        if value is None:
            return self.MAX_PAYLOAD_BYTES + 64 * 1024
        return int(value)

    @property
    def DATABASE_ALIAS(self) -> str:
        return self._get("WEFT_DATABASE_ALIAS")

    @property
    def READ_DATABASE(self) -> str:
        """The alias the read-only pages read from: ``WEFT_READ_DATABASE``, else
        ``WEFT_DATABASE_ALIAS`` (docs/explanation/scaling.md, "Read replicas")."""
        value = self._get("WEFT_READ_DATABASE")
        return self.DATABASE_ALIAS if value is None else value

    @property
    def RETENTION(self) -> dict[RunStatus, float | None]:
        """Seconds a terminal run of each status is kept (``None``: forever)."""
        return parse_retention(self._get("WEFT_RETENTION"))

    @property
    def DEFAULT_RETRY_POLICY(self) -> RetryPolicy:
        return RetryPolicy.coerce(self._get("WEFT_DEFAULT_RETRY_POLICY"))

    @property
    def RETRY_INLINE_MAX_DELAY(self) -> float:
        return parse_duration(self._get("WEFT_RETRY_INLINE_MAX_DELAY"), what="WEFT_RETRY_INLINE_MAX_DELAY")

    @property
    def PREPARE_STATEMENTS(self) -> bool:
        return bool(self._get("WEFT_PREPARE_STATEMENTS"))

    @property
    def RATE_LIMITS(self) -> dict[str, Rate]:
        """The rates that override rate limits' own, by name (``{"stripe": "50/s"}``)."""
        return parse_rate_limits(self._get("WEFT_RATE_LIMITS"))

    def engine_config(self) -> EngineConfig:
        """The engine's settings, parsed once per settings object (a turn asks several
        times; ``override_settings`` and a changed ``WEFT_*`` setting make it new)."""
        holder = getattr(django_settings, "_wrapped", None)
        found = _read.get(_ENGINE_CONFIG)
        if found is not None and found[0] is holder:
            return cast(EngineConfig, found[1])
        config = EngineConfig(
            lease_ttl=self.LEASE_TTL,
            takeover_grace=self.TAKEOVER_GRACE,
            default_retry=self.DEFAULT_RETRY_POLICY,
            inline_retry_max_delay=self.RETRY_INLINE_MAX_DELAY,
            redispatch_after=self.REDISPATCH_AFTER,
            rate_limits=MappingProxyType(self.RATE_LIMITS),
        )
        _read[_ENGINE_CONFIG] = (holder, config)
        return config


weft_settings = WeftSettings()
