"""Settings of the end-to-end benchmark (``benchmarks/end_to_end.py``): django_weft's
defaults on one PostgreSQL database, as a project beside ``weft_worker`` would have
them (the sweep-only dispatcher, work notices on)."""

from __future__ import annotations

import os

from benchmarks.common import ADMIN_APPS, database_settings
from benchmarks.common import TEMPLATES as TEMPLATES_OF_THE_ADMIN

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

if os.environ.get("WEFT_E2E_BENCH_PAGES") == "1":
    # benchmarks/parked.py times the admin changelist and the REST list in its own process.
    INSTALLED_APPS = [
        *INSTALLED_APPS[:2],
        "django.contrib.sessions",
        *ADMIN_APPS,
        "rest_framework",
        "drf_spectacular",
        "drf_spectacular_sidecar",
        *INSTALLED_APPS[2:],
    ]
    MIDDLEWARE = [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ]
    TEMPLATES = TEMPLATES_OF_THE_ADMIN
    STATIC_URL = "static/"
    ALLOWED_HOSTS = ["testserver"]
    ROOT_URLCONF = "benchmarks.e2e_bench.urls"
    REST_FRAMEWORK = {
        "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication"],
    }
# benchmarks/parked.py --tick-batch, for its process and its workers'.
WEFT_TICK_BATCH = int(os.environ.get("WEFT_E2E_BENCH_TICK_BATCH", "100"))
