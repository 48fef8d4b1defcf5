"""OpenTelemetry traces of runs, turns and activity attempts (``pip install
"django-weft[otel]"``), turned on by ``WEFT_TRACING = True`` (docs/how-to/observe.md).

Only ``opentelemetry-api`` is used: the SDK, its exporters and the ``TracerProvider`` are
the application's, and nothing here installs or replaces one. Without a provider the
API's no-op tracer makes every span a no-op.

The package imports this module only when tracing is on; :func:`install` is called by the
app's ``ready()`` and raises ``ImproperlyConfigured`` (naming the extra) when the API
cannot be imported. The system check ``django_weft.E029`` says so first."""

from __future__ import annotations

from ..extras import require_extra

require_extra("otel", "WEFT_TRACING", "opentelemetry.trace")

from ..engine.observe import add_observer, observers, remove_observer  # noqa: E402 - after the check
from .observer import TracingObserver  # noqa: E402

__all__ = ["TracingObserver", "install", "uninstall"]


def install() -> TracingObserver:
    """Register the tracing observer in this process: spans, and the caller's trace
    context stored with each run started and each message sent. Idempotent."""
    for observer in observers():
        if isinstance(observer, TracingObserver):
            return observer
    observer = TracingObserver()
    add_observer(observer)
    return observer


def uninstall() -> None:
    """Undo :func:`install` (tests, or a setting changed at run time)."""
    for observer in observers():
        if isinstance(observer, TracingObserver):
            remove_observer(observer)
