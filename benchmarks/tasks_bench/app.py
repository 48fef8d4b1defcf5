"""The benchmark's Celery app, laid out as a user's ``proj/celery.py``."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.tasks_bench.settings")

app = Celery("tasks_bench")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Only this project's tasks: autodiscovery over every installed app would also import
# django_weft.tasks, the framework backend, which the Celery part does not use.
app.autodiscover_tasks(["benchmarks.tasks_bench"])
