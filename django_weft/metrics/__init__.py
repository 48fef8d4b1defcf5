"""Prometheus metrics for django_weft (the ``prometheus`` extra: ``pip install
"django-weft[prometheus]"``).

``WEFT_METRICS = True`` turns them on at startup (the app's ``ready()``): an observer of
the engine's observation points (:mod:`django_weft.engine.observe`) records counters and
histograms in ``prometheus_client``'s default registry, and the tick sets the gauges. Any
exporter of that registry serves them (``django-prometheus``, or
:mod:`django_weft.metrics.urls`). This module imports without ``prometheus_client``:
only :func:`enable` and the view need it, and say which extra to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .prometheus import PrometheusObserver

__all__ = ["disable", "enable", "enabled"]

_installed: list[PrometheusObserver] = []


def enable() -> None:
    """Record the metrics in this process from now on (idempotent). Raises
    ``ImproperlyConfigured`` naming the ``prometheus`` extra when it is not installed."""
    from ..engine import observe
    from .prometheus import PrometheusObserver

    if not _installed:
        _installed.append(PrometheusObserver())
    observe.add_observer(_installed[0])


def disable() -> None:
    """Stop recording (the metrics keep their values)."""
    from ..engine import observe

    for observer in _installed:
        observe.remove_observer(observer)


def enabled() -> bool:
    """Whether the metrics are recorded in this process."""
    from ..engine import observe

    return any(observer in observe.observers() for observer in _installed)
