"""Settings for the test suite. ``WEFT_TEST_DB=postgres`` (default) or ``sqlite``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "tests-only-not-secret"
DEBUG = False
# The fault tests serve the test project over HTTP from a process of its own.
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # the API docs pages' static files
    "django_weft",
    "django_weft.contrib.celery",
    "tests.testapp",
    # The chaos suite's workload (tests/chaos): installed here too, so the normal suite
    # has its tables for the tests that prove each invariant can fail.
    "tests.chaos",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # A server span per request, as an HTTP instrumentation would make (a no-op until a
    # test installs an SDK): the parent of the runs a request starts.
    "tests.support.tracing.RequestSpanMiddleware",
]

# A worker process of a tracing test (tests/integration/test_tracing_processes.py): its
# spans go to the test's file, and the tracing observer is on.
if os.environ.get("WEFT_TEST_SPAN_FILE"):
    from tests.support.tracing import export_to_file

    export_to_file(os.environ["WEFT_TEST_SPAN_FILE"])
    WEFT_TRACING = True
ROOT_URLCONF = "tests.urls"
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

TEST_DB = os.environ.get("WEFT_TEST_DB", "postgres")
DATABASES: dict[str, dict[str, Any]]
if TEST_DB == "sqlite":
    _sqlite_dir = Path(os.environ.get("WEFT_TEST_SQLITE_DIR", tempfile.gettempdir()))
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            # A child worker process is pointed at the test database by WEFT_TEST_SQLITE_NAME.
            "NAME": os.environ.get(
                "WEFT_TEST_SQLITE_NAME", str(_sqlite_dir / f"weft-tests-{os.getpid()}.sqlite3")
            ),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL;",
            },
            "TEST": {"NAME": str(_sqlite_dir / f"weft-tests-{os.getpid()}-test.sqlite3")},
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ.get("WEFT_TEST_PG_NAME", "weft"),
            "USER": os.environ.get("PGUSER", "postgres"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "TEST": {"NAME": os.environ.get("WEFT_TEST_PG_TEST_NAME", "test_weft")},
            # Celery worker processes keep their connection between tasks, as a production
            # deployment should (a new PostgreSQL backend per task costs more than the task).
            # The fault tests set both for the processes they start.
            "CONN_MAX_AGE": int(
                os.environ.get(
                    "WEFT_TEST_CONN_MAX_AGE", 60 if os.environ.get("WEFT_TEST_CELERY") == "1" else 0
                )
            ),
            "CONN_HEALTH_CHECKS": os.environ.get("WEFT_TEST_CONN_HEALTH_CHECKS") == "1",
            # A process test counts the connections of the process it started by this name.
            "OPTIONS": {"application_name": os.environ.get("WEFT_TEST_PG_APPLICATION_NAME", "")},
        }
    }

# A second alias on the same database, as a read replica would be: under the test runner
# it mirrors the default test database (no database of its own, no migrations). Only the
# tests of WEFT_READ_DATABASE name it; the rest of the suite never reads it.
DATABASES["replica"] = {**DATABASES["default"], "TEST": {"MIRROR": "default"}}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Django's task framework: django.tasks on Django 6, the django-tasks backport on 5.2.
try:
    import django.tasks  # noqa: F401

    _IMMEDIATE = "django.tasks.backends.immediate.ImmediateBackend"
except ImportError:
    INSTALLED_APPS.append("django_tasks")
    _IMMEDIATE = "django_tasks.backends.immediate.ImmediateBackend"
TASKS = {
    "default": {"BACKEND": "django_weft.tasks.WeftTaskBackend", "QUEUES": ["default", "emails"]},
    "retrying": {
        "BACKEND": "django_weft.tasks.WeftTaskBackend",
        "OPTIONS": {"retry": {"max_attempts": 3, "initial_interval": 0.01}},
    },
    "immediate": {"BACKEND": _IMMEDIATE},
}

# Short leases so takeover tests finish quickly; the TTL >= 3 x renew rule still holds.
WEFT_LEASE_TTL = 3
WEFT_LEASE_RENEW_INTERVAL = 0.5
WEFT_TAKEOVER_GRACE = 0.5
# Child worker processes of the metrics tests record Prometheus metrics.
WEFT_METRICS = os.environ.get("WEFT_TEST_METRICS") == "1"
WEFT_METRICS_SAMPLE_INTERVAL = float(os.environ.get("WEFT_TEST_METRICS_SAMPLE_INTERVAL", "15"))
WEFT_TICK_INTERVAL = float(os.environ.get("WEFT_TEST_TICK_INTERVAL", "0.2"))
# PostgreSQL's work notices (LISTEN/NOTIFY); WEFT_TEST_NOTIFY=off runs the suite, and the
# worker processes it starts, on the sweeps alone.
WEFT_NOTIFY = os.environ.get("WEFT_TEST_NOTIFY", "on") != "off"
WEFT_WORKER_GC_FREEZE = os.environ.get("WEFT_TEST_GC_FREEZE", "on") != "off"
WEFT_REDISPATCH_AFTER = float(os.environ.get("WEFT_TEST_REDISPATCH_AFTER", "1"))

# The in-process tests ring no doorbells; the Celery process tests (and the Celery worker
# and beat processes they start) use the Celery dispatcher and a real broker.
if os.environ.get("WEFT_TEST_CELERY") != "1":
    WEFT_DISPATCHER = "django_weft.runtime.dispatch.SweepOnlyDispatcher"
elif os.environ.get("WEFT_TEST_DISPATCHER"):
    WEFT_DISPATCHER = os.environ["WEFT_TEST_DISPATCHER"]
CELERY_BROKER_URL = os.environ.get("WEFT_TEST_BROKER_URL", "redis://127.0.0.1:6379/15")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_DB_REUSE_MAX = 1000
CELERY_WORKER_PREFETCH_MULTIPLIER = int(os.environ.get("WEFT_TEST_PREFETCH", "1"))
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 60}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"stamped": {"format": "%(asctime)s %(processName)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "stamped"}},
    "loggers": {
        "django_weft": {
            "handlers": ["console"],
            "level": os.environ.get("WEFT_LOG_LEVEL", "WARNING"),
            # Celery workers log the root logger too: each line once, not twice.
            "propagate": False,
        }
    },
}
STATIC_URL = "static/"
# The live server serves MEDIA_URL from disk; left empty, every path would be looked up as
# a file first (a 10,000-character path then fails in the test server, not in the app).
MEDIA_URL = "/media/"
# Tests authenticate every API request with a password: a fast hasher keeps that cheap.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
