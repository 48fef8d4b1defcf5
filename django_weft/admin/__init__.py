"""django_weft's Django admin: imported by ``admin.autodiscover()`` as the app's ``admin``
module (a package works as well as a module), which registers the screens."""

from __future__ import annotations

from django.contrib import admin

from ..models import WorkflowRun
from .runs import WorkflowRunAdmin

admin.site.register(WorkflowRun, WorkflowRunAdmin)

__all__ = ["WorkflowRunAdmin"]
