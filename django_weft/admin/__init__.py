"""django_weft's Django admin: imported by ``admin.autodiscover()`` as the app's ``admin``
module (a package works as well as a module), which registers the screens.

For the project's own admin: :func:`related_runs`, a read-only field listing an object's
workflow runs on its admin page."""

from __future__ import annotations

from django.contrib import admin

from ..models import Schedule, WorkflowRun
from .related import RelatedRuns, related_runs
from .runs import WorkflowRunAdmin
from .schedules import ScheduleAdmin

admin.site.register(WorkflowRun, WorkflowRunAdmin)
admin.site.register(Schedule, ScheduleAdmin)

__all__ = ["RelatedRuns", "ScheduleAdmin", "WorkflowRunAdmin", "related_runs"]
