"""Settings of the Celery throughput benchmark (its own database and Redis database)."""

from __future__ import annotations

import os

from benchmarks.common import database_settings

SECRET_KEY = "benchmark-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_weft",
    "django_weft.contrib.celery",
    "benchmarks.celery_bench",
]
DATABASES = {"default": database_settings(os.environ.get("WEFT_BENCH_DB", "weft_celery_bench"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING_CONFIG = None

CELERY_BROKER_URL = os.environ.get("WEFT_BENCH_BROKER_URL", "redis://127.0.0.1:6379/14")
CELERY_TASK_IGNORE_RESULT = True
# Celery's Django fixup closes every database connection before and after each task unless
# this is set; reconnecting costs more than a turn (see docs/how-to/deploy-with-celery.md).
CELERY_DB_REUSE_MAX = 1000
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_WORKER_REDIRECT_STDOUTS = False

# Production-like defaults (DESIGN §7), with the sweep every second.
WEFT_TICK_INTERVAL = 1
