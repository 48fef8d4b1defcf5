"""The optional extras of the distribution (``pip install "django-weft[EXTRA]"``) and what
says so when one is missing: the modules that need an extra call :func:`require_extra` at
import, and the system checks use :func:`missing_module` (docs/reference/checks.md)."""

from __future__ import annotations

import importlib

from django.core.exceptions import ImproperlyConfigured


def missing_module(*modules: str) -> tuple[str, ImportError] | None:
    """The first of ``modules`` that cannot be imported, with the error; ``None`` when all can."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return module, exc
    return None


def install_hint(extra: str) -> str:
    return f'pip install "django-weft[{extra}]"'


def require_extra(extra: str, needed_by: str, *modules: str) -> None:
    """Raise ``ImproperlyConfigured`` naming the extra to install when one of ``modules``
    cannot be imported, rather than a bare ``ModuleNotFoundError`` from deep inside."""
    missing = missing_module(*modules)
    if missing is not None:
        module, exc = missing
        raise ImproperlyConfigured(
            f"{needed_by} needs the {extra!r} extra, and {module} cannot be imported ({exc}). "
            f"Install it with: {install_hint(extra)}"
        ) from exc
