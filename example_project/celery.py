"""The project's Celery app, the standard Django layout: settings come from the
``CELERY_*`` names in settings.py, tasks from installed apps (django_weft's included)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

app = Celery("example_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

from django_weft.contrib.celery import beat_schedule  # noqa: E402

# The sweep: fires due timers, re-dispatches runnable runs and expired leases.
app.conf.beat_schedule = {**app.conf.beat_schedule, **beat_schedule()}
