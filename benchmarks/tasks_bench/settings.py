"""Settings of the task-backend benchmark (``benchmarks/tasks.py``): one database for
django_weft and django-tasks-db, a Redis database for Celery.

Two task backends: ``default`` is django_weft's ``WeftTaskBackend`` (configured as a user
would, with ``QUEUES``) and ``db`` is django-tasks-db's ``DatabaseBackend``. While
``django_weft.tasks`` does not exist, ``default`` is the framework's dummy backend and the
benchmark leaves the weft part out."""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path

import django_weft
from benchmarks.common import database_settings

SECRET_KEY = "benchmark-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
# Django 6 has the framework as django.tasks; on 5.2 it is the django-tasks backport.
FRAMEWORK = "django.tasks" if find_spec("django.tasks") else "django_tasks"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    *(["django_tasks"] if FRAMEWORK == "django_tasks" else []),
    "django_tasks_db",
    "django_weft",
    "benchmarks.tasks_bench",
]
DATABASES = {"default": database_settings(os.environ.get("WEFT_TASKS_BENCH_DB", "weft_tasks_bench"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING_CONFIG = None

# The backend of the django_weft being measured, not one that an editable install of
# another checkout lends to a missing submodule.
_WEFT_TASKS = find_spec("django_weft.tasks")
WEFT_AVAILABLE = (
    _WEFT_TASKS is not None
    and _WEFT_TASKS.origin is not None
    and Path(_WEFT_TASKS.origin).is_relative_to(Path(django_weft.__file__).parent)
)
DUMMY_BACKEND = f"{FRAMEWORK}.backends.dummy.DummyBackend"
TASKS = {
    "default": {
        "BACKEND": "django_weft.tasks.WeftTaskBackend" if WEFT_AVAILABLE else DUMMY_BACKEND,
        "QUEUES": ["default"],
    },
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]},
}

# django_weft with its defaults: the client's NOTIFY wakes weft_worker when an enqueue
# commits (WEFT_NOTIFY), and the sweep runs every second (WEFT_TICK_INTERVAL).
# db_worker's poll interval is its --interval option (benchmarks/tasks.py --poll-interval).
WEFT_AUTODISCOVER_MODULE = None

CELERY_BROKER_URL = os.environ.get("WEFT_TASKS_BENCH_BROKER_URL", "redis://127.0.0.1:6379/13")
CELERY_TASK_IGNORE_RESULT = True
CELERY_DB_REUSE_MAX = 1000
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_WORKER_REDIRECT_STDOUTS = False
