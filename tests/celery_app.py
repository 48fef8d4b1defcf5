"""The Celery app of the test project, as a user's ``proj/celery.py`` would be."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

app = Celery("tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

from django_weft.contrib.celery import beat_schedule  # noqa: E402

app.conf.beat_schedule = {**app.conf.beat_schedule, **beat_schedule()}
