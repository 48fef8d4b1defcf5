"""Settings of the end-to-end benchmark (``benchmarks/end_to_end.py``): django_weft's
defaults on one PostgreSQL database, as a project beside ``weft_worker`` would have
them (the sweep-only dispatcher, work notices on)."""

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
    "benchmarks.e2e_bench",
]
DATABASES = {"default": database_settings(os.environ.get("WEFT_E2E_BENCH_DB", "weft_e2e_bench"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING_CONFIG = None
WEFT_NOTIFY = os.environ.get("WEFT_E2E_BENCH_NOTIFY", "1") == "1"
