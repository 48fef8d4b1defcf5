"""System checks ``django_weft.E0xx`` (errors) and ``W0xx`` (warnings)."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.urls import URLResolver, get_resolver
from django.utils.module_loading import import_string

from .conf import DEFAULTS, weft_settings
from .engine.errors import WeftError
from .engine.registry import registry
from .engine.retry import RetryPolicy
from .extras import install_hint, missing_module


def _value_error(setting: str, exc: Exception, check_id: str) -> Error:
    return Error(
        f"{setting} is invalid: {exc}", hint=f"See docs/reference/settings.md#{setting.lower()}", id=check_id
    )


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    errors: list[Any] = []
    numbers = {
        "WEFT_LEASE_TTL": "E001",
        "WEFT_LEASE_RENEW_INTERVAL": "E002",
        "WEFT_TICK_INTERVAL": "E003",
        "WEFT_TAKEOVER_GRACE": "E004",
        "WEFT_REDISPATCH_AFTER": "E005",
        "WEFT_RETRY_INLINE_MAX_DELAY": "E006",
    }
    values: dict[str, float] = {}
    for setting, number in numbers.items():
        try:
            values[setting] = getattr(weft_settings, setting.removeprefix("WEFT_"))
        except WeftError as exc:
            errors.append(_value_error(setting, exc, f"django_weft.{number}"))
    ttl, renew = values.get("WEFT_LEASE_TTL"), values.get("WEFT_LEASE_RENEW_INTERVAL")
    if ttl is not None and renew is not None:
        if renew <= 0:
            errors.append(Error("WEFT_LEASE_RENEW_INTERVAL must be positive.", id="django_weft.E002"))
        elif ttl < 3 * renew:
            errors.append(
                Error(
                    f"WEFT_LEASE_TTL ({ttl:g} s) must be at least 3 x WEFT_LEASE_RENEW_INTERVAL "
                    f"({renew:g} s), so a lease survives two missed renewals.",
                    hint="Raise WEFT_LEASE_TTL or lower WEFT_LEASE_RENEW_INTERVAL.",
                    id="django_weft.E007",
                )
            )
    if values.get("WEFT_TICK_INTERVAL") is not None and values["WEFT_TICK_INTERVAL"] <= 0:
        errors.append(Error("WEFT_TICK_INTERVAL must be positive.", id="django_weft.E003"))
    for setting, number in (("WEFT_TICK_BATCH", "E008"), ("WEFT_MAX_PAYLOAD_BYTES", "E009")):
        value = getattr(settings, setting, DEFAULTS[setting])
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            errors.append(
                Error(f"{setting} must be a positive integer; got {value!r}.", id=f"django_weft.{number}")
            )
    module = getattr(settings, "WEFT_AUTODISCOVER_MODULE", DEFAULTS["WEFT_AUTODISCOVER_MODULE"])
    if module is not None and (not isinstance(module, str) or not module.isidentifier()):
        errors.append(
            Error(
                f"WEFT_AUTODISCOVER_MODULE must be a module name like 'workflows', or None; got {module!r}.",
                id="django_weft.E015",
            )
        )
    permissions = getattr(settings, "WEFT_API_PERMISSION_CLASSES", None)
    if permissions is not None and (
        not isinstance(permissions, list | tuple) or not all(isinstance(p, str) for p in permissions)
    ):
        errors.append(
            Error(
                "WEFT_API_PERMISSION_CLASSES must be a list of import strings of DRF permission classes, "
                f"or None; got {permissions!r}.",
                id="django_weft.E016",
            )
        )
    elif permissions is not None:
        for path in permissions:
            try:
                import_string(path)
            except ImportError as exc:
                errors.append(
                    Error(
                        f"WEFT_API_PERMISSION_CLASSES names {path!r}, which cannot be imported: {exc}.",
                        id="django_weft.E016",
                    )
                )
    errors.extend(_check_api())
    try:
        _ = weft_settings.RETENTION
    except WeftError as exc:
        errors.append(_value_error("WEFT_RETENTION", exc, "django_weft.E010"))
    try:
        _ = weft_settings.DEFAULT_RETRY_POLICY
    except (WeftError, TypeError) as exc:
        errors.append(_value_error("WEFT_DEFAULT_RETRY_POLICY", exc, "django_weft.E011"))
    errors.extend(_check_rate_limits())
    errors.extend(_check_task_backends())
    queue = getattr(settings, "WEFT_CELERY_QUEUE", None)
    if queue is not None and (not isinstance(queue, str) or not queue.strip()):
        errors.append(
            Error(f"WEFT_CELERY_QUEUE must be a queue name or None; got {queue!r}.", id="django_weft.E017")
        )
    try:
        from .runtime.dispatch import get_dispatcher

        get_dispatcher()
    except Exception as exc:
        errors.append(_value_error("WEFT_DISPATCHER", exc, "django_weft.E012"))
    errors.extend(_check_database())
    errors.extend(_check_read_database())
    return errors


def _check_rate_limits() -> list[Any]:
    """``WEFT_RATE_LIMITS``: every value a rate in one of the documented forms (E024), and
    a warning for a name no registered activity's rate limit has (a typo overrides
    nothing; W002)."""
    try:
        rates = weft_settings.RATE_LIMITS
    except WeftError as exc:
        return [
            Error(
                f"WEFT_RATE_LIMITS is invalid: {exc}.",
                hint="Write each rate as '<limit>/<period>', for example '50/s', '600/m' or '10/5s'. "
                "See docs/reference/settings.md#weft_rate_limits",
                id="django_weft.E024",
            )
        ]
    used = registry.rate_limit_names()
    return [
        Warning(
            f"WEFT_RATE_LIMITS names the rate limit {name!r}, which no registered activity uses, so it "
            "changes nothing.",
            hint=f"Check the spelling; the rate limits in use are: {', '.join(sorted(used)) or 'none'}.",
            id="django_weft.W002",
        )
        for name in sorted(set(rates) - used)
    ]


TASK_BACKEND_OPTIONS = frozenset({"retry"})
"""The keys a ``WeftTaskBackend``'s ``OPTIONS`` may have."""


def _check_task_backends() -> list[Any]:
    """Each ``TASKS`` entry naming ``WeftTaskBackend``: its ``OPTIONS`` keys (E025) and
    its ``retry`` policy (E026). Checked here, not by the task framework's checks, so a
    project sees them whatever framework it runs on."""
    from .apps import TASK_BACKENDS

    configured = getattr(settings, "TASKS", None)
    errors: list[Any] = []
    for alias, params in configured.items() if isinstance(configured, dict) else ():
        if not isinstance(params, dict) or params.get("BACKEND") not in TASK_BACKENDS:
            continue
        options = params.get("OPTIONS") or {}
        where = f"TASKS[{alias!r}]['OPTIONS']"
        if not isinstance(options, dict):
            errors.append(Error(f"{where} must be a dict; got {options!r}.", id="django_weft.E025"))
            continue
        unknown = sorted(set(options) - TASK_BACKEND_OPTIONS)
        if unknown:
            errors.append(
                Error(
                    f"{where} has unknown keys: {', '.join(map(repr, unknown))}.",
                    hint=f"WeftTaskBackend takes {', '.join(sorted(TASK_BACKEND_OPTIONS))}.",
                    id="django_weft.E025",
                )
            )
        retry = options.get("retry")
        if retry is not None:
            try:
                RetryPolicy.coerce(retry)
            except (WeftError, TypeError, ValueError) as exc:
                errors.append(
                    Error(
                        f"{where}['retry'] is not a retry policy: {exc}.",
                        hint="Give a django_weft.RetryPolicy (RetryPolicy(max_attempts=3, "
                        "initial_interval='1s')) or a dict of its fields.",
                        id="django_weft.E026",
                    )
                )
    return errors


def _check_api() -> list[Any]:
    errors = []
    run_filter = getattr(settings, "WEFT_API_RUN_FILTER", None)
    if run_filter is not None:
        try:
            function = import_string(run_filter) if isinstance(run_filter, str) else None
        except ImportError as exc:
            function = None
            reason = f"it cannot be imported: {exc}"
        else:
            reason = "it is not a callable" if function is not None else f"got {run_filter!r}"
        if function is None or not callable(function):
            errors.append(
                Error(
                    "WEFT_API_RUN_FILTER must be the import string of a function "
                    f"(request, queryset) -> queryset, or None; {reason}.",
                    id="django_weft.E018",
                )
            )
    try:
        if weft_settings.API_MAX_WAIT < 0:
            errors.append(Error("WEFT_API_MAX_WAIT must not be negative.", id="django_weft.E019"))
    except WeftError as exc:
        errors.append(_value_error("WEFT_API_MAX_WAIT", exc, "django_weft.E019"))
    body = getattr(settings, "WEFT_API_MAX_BODY_BYTES", None)
    if body is not None and (not isinstance(body, int) or isinstance(body, bool) or body < 1):
        errors.append(
            Error(
                f"WEFT_API_MAX_BODY_BYTES must be a positive integer or None; got {body!r}.",
                id="django_weft.E020",
            )
        )
    return errors


def _check_database() -> list[Any]:
    alias = weft_settings.DATABASE_ALIAS
    if alias not in settings.DATABASES:
        return [
            Error(
                f"WEFT_DATABASE_ALIAS is {alias!r}, which is not in DATABASES.",
                hint=f"Use one of: {', '.join(settings.DATABASES)}.",
                id="django_weft.E013",
            )
        ]
    try:
        connection = connections[alias]
    except ImproperlyConfigured as exc:
        # Django cannot load the backend: without psycopg, say which extra brings it.
        engine = str(settings.DATABASES[alias].get("ENGINE", ""))
        errors = _psycopg_missing(alias, str(exc)) if "postgres" in engine or "postgis" in engine else []
        if not errors:
            raise
        return errors
    if connection.vendor == "postgresql":
        return _psycopg_missing(alias, "")
    if connection.vendor not in ("postgresql", "sqlite"):
        return [
            Error(
                f"django_weft supports PostgreSQL and SQLite; database {alias!r} is {connection.vendor}.",
                id="django_weft.E014",
            )
        ]
    if connection.vendor == "sqlite":
        mode = (connection.settings_dict.get("OPTIONS") or {}).get("transaction_mode")
        if (mode or "").upper() != "IMMEDIATE":
            return [
                Warning(
                    f"SQLite database {alias!r} does not use transaction_mode 'IMMEDIATE'; concurrent "
                    "workers can then fail with 'database is locked'.",
                    hint='Set DATABASES[...]["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20}.',
                    id="django_weft.W001",
                )
            ]
    return []


def _check_read_database() -> list[Any]:
    """``WEFT_READ_DATABASE``: ``None``, or an alias in ``DATABASES`` (E030) of the same
    kind of database as ``WEFT_DATABASE_ALIAS``'s (E031): the read-only pages run the
    queries written for the primary on it."""
    alias = getattr(settings, "WEFT_READ_DATABASE", None)
    if alias is None:
        return []
    hint = (
        "Name the alias of a replica of the database in WEFT_DATABASE_ALIAS, or set None to read "
        "from WEFT_DATABASE_ALIAS. See docs/reference/settings.md#weft_read_database"
    )
    if not isinstance(alias, str):
        return [
            Error(
                f"WEFT_READ_DATABASE must be the alias of a database in DATABASES, or None; got {alias!r}.",
                hint=hint,
                id="django_weft.E030",
            )
        ]
    if alias not in settings.DATABASES:
        return [
            Error(
                f"WEFT_READ_DATABASE is {alias!r}, which is not in DATABASES "
                f"(its aliases: {', '.join(settings.DATABASES)}).",
                hint=hint,
                id="django_weft.E030",
            )
        ]
    primary = weft_settings.DATABASE_ALIAS
    if alias == primary or primary not in settings.DATABASES:
        return []  # the primary's own problems are E013 and after
    try:
        kinds = connections[alias].vendor, connections[primary].vendor
    except ImproperlyConfigured as exc:
        return [
            Error(
                f"WEFT_READ_DATABASE is {alias!r}, whose backend Django cannot load: {exc}",
                id="django_weft.E031",
            )
        ]
    if kinds[0] != kinds[1]:
        return [
            Error(
                f"WEFT_READ_DATABASE is {alias!r}, a {kinds[0]} database, and WEFT_DATABASE_ALIAS "
                f"{primary!r} is {kinds[1]}: the read database must be a replica of the primary.",
                hint=hint,
                id="django_weft.E031",
            )
        ]
    return []


@register(Tags.compatibility)
def check_tracing(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """``WEFT_TRACING`` is on and the OpenTelemetry API cannot be imported."""
    if not weft_settings.TRACING:
        return []
    missing = missing_module("opentelemetry.trace")
    if missing is None:
        return []
    return [
        Error(
            f"WEFT_TRACING is on, and the OpenTelemetry API cannot be imported ({missing[1]}).",
            hint=f"Install the 'otel' extra: {install_hint('otel')}, or set WEFT_TRACING = False.",
            id="django_weft.E029",
        )
    ]


def _psycopg_missing(alias: str, django_says: str) -> list[Any]:
    """django_weft sends its step writes through psycopg 3 on PostgreSQL (psycopg2 alone
    serves Django, not those)."""
    missing = missing_module("psycopg")
    if missing is None:
        return []
    reason = f" Django says: {django_says}" if django_says else ""
    return [
        Error(
            f"Database {alias!r} is PostgreSQL, and psycopg 3 cannot be imported ({missing[1]}).{reason}",
            hint=f"Install the 'postgres' extra: {install_hint('postgres')}",
            id="django_weft.E023",
        )
    ]


API_URLS = "django_weft.api.urls"

#: The apps the REST API's schema pages need when its URLs are mounted, with what goes
#: wrong without each (docs/reference/checks.md).
API_PAGE_APPS = {
    "drf_spectacular": (
        "django_weft.E021",
        "its Swagger UI page answers 500 (TemplateDoesNotExist: drf_spectacular/swagger_ui.html)",
    ),
    "drf_spectacular_sidecar": (
        "django_weft.E022",
        "its Swagger UI and Redoc pages load no script (their static files are that app's)",
    ),
}


@register(Tags.compatibility)
def check_metrics(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """``WEFT_METRICS`` on without ``prometheus_client`` (E027), or an interval that is not
    a positive duration (E028)."""
    errors: list[Any] = []
    try:
        interval = weft_settings.METRICS_SAMPLE_INTERVAL
    except WeftError as exc:
        errors.append(_value_error("WEFT_METRICS_SAMPLE_INTERVAL", exc, "django_weft.E028"))
    else:
        if interval <= 0:
            errors.append(Error("WEFT_METRICS_SAMPLE_INTERVAL must be positive.", id="django_weft.E028"))
    if weft_settings.METRICS:
        missing = missing_module("prometheus_client")
        if missing is not None:
            errors.append(
                Error(
                    f"WEFT_METRICS is on, and prometheus_client cannot be imported ({missing[1]}): "
                    "no metric is recorded.",
                    hint=f"Install the 'prometheus' extra: {install_hint('prometheus')}, "
                    "or set WEFT_METRICS = False.",
                    id="django_weft.E027",
                )
            )
    return errors


@register(Tags.urls)
def check_api_apps(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """The URL conf mounts ``django_weft.api.urls`` without an app its schema pages need."""
    if not _mounts(API_URLS):
        return []
    return [
        Error(
            f"The URL conf includes {API_URLS!r}, but {app!r} is not in INSTALLED_APPS: {what}.",
            hint=f'Add "{app}" to INSTALLED_APPS (see docs/reference/rest.md).',
            id=check_id,
        )
        for app, (check_id, what) in API_PAGE_APPS.items()
        if not apps.is_installed(app)
    ]


def _mounts(module_name: str) -> bool:
    """Whether the project's URL conf includes ``module_name``, at any depth."""
    try:
        patterns = list(get_resolver().url_patterns)
    except Exception:
        # A URL conf that does not load is reported by Django's own URL check.
        return False
    while patterns:
        pattern = patterns.pop()
        if not isinstance(pattern, URLResolver):
            continue
        if getattr(pattern.urlconf_module, "__name__", pattern.urlconf_name) == module_name:
            return True
        try:
            patterns.extend(pattern.url_patterns)
        except Exception:
            continue
    return False
