"""The benchmark's Celery app, laid out as a user's ``proj/celery.py``."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.celery_bench.settings")

app = Celery("celery_bench")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

from django_weft.contrib.celery import beat_schedule  # noqa: E402

app.conf.beat_schedule = {**app.conf.beat_schedule, **beat_schedule()}
