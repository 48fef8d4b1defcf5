"""The one way to name and reverse the admin's URLs: ``admin:<app>_<model>_<view>``, the
names Django's admin gives its own views (``changelist``, ``change``...) and the names
given here to the extra views (``dashboard``, ``signal``, ``reset``, ``backfill``...)."""

from __future__ import annotations

from typing import Any

from django.db.models import Model
from django.urls import reverse


def url_name(model: type[Model], view: str) -> str:
    """The URL name of ``view`` of ``model``'s admin, without the namespace:
    ``django_weft_workflowrun_dashboard``, as given to ``path(name=...)``."""
    opts = model._meta
    return f"{opts.app_label}_{opts.model_name}_{view}"


def admin_url(model: type[Model], view: str, *args: Any, site: str | None = None) -> str:
    """The URL of ``view`` of ``model``'s admin (``args`` fill its pattern, an object id
    for ``change``): on the admin site named ``site``, else the default one."""
    return reverse(f"admin:{url_name(model, view)}", args=args, current_app=site)


__all__ = ["admin_url", "url_name"]
