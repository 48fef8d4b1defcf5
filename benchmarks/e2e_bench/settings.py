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

if os.environ.get("WEFT_E2E_BENCH_PAGES") == "1":
    # benchmarks/parked.py times the admin changelist and the REST list in its own process.
    INSTALLED_APPS = [
        *INSTALLED_APPS[:2],
        "django.contrib.sessions",
        "django.contrib.admin",
        "django.contrib.messages",
        "django.contrib.staticfiles",
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
    TEMPLATES = [
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "APP_DIRS": True,
            "OPTIONS": {
                "context_processors": [
                    "django.template.context_processors.request",
                    "django.contrib.auth.context_processors.auth",
                    "django.contrib.messages.context_processors.messages",
                ]
            },
        }
    ]
    STATIC_URL = "static/"
    ALLOWED_HOSTS = ["testserver"]
    ROOT_URLCONF = "benchmarks.e2e_bench.urls"
    REST_FRAMEWORK = {
        "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication"],
    }
