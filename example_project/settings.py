"""Settings of the example project: one Django site with the ``orders`` demo app.

Embedded by default: SQLite in ``example_project/var/db.sqlite3``, set up for several
processes (a web server, Celery workers and beat) writing at once, and Celery on a
filesystem transport (messages are files in ``example_project/var/broker/``; see
``example_project/broker.py``), so no database or broker server is needed.
``WEFT_EXAMPLE_VAR_DIR`` moves that state folder elsewhere (the test command runs its
own copy of the example there). Production-like services instead:

    DATABASE_URL=postgres://user:password@host:port/name
    CELERY_BROKER_URL=redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent
VAR_DIR = Path(os.environ.get("WEFT_EXAMPLE_VAR_DIR") or BASE_DIR / "var").resolve()

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-project-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

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
    "django_weft.contrib.celery",  # workers run turns and activities; beat drives the sweep
    "example_project.orders",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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


def database_from_url(url: str) -> dict[str, Any]:
    """A ``DATABASES`` entry for a ``postgres://user:password@host:port/name`` URL.

    Query parameters (``?sslmode=require``) become connection ``OPTIONS``.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ImproperlyConfigured(
            f"DATABASE_URL must start with postgres:// or postgresql://; got {parts.scheme or 'no'} scheme"
        )
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured("DATABASE_URL must name a database: postgres://user@host:5432/NAME")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": dict(parse_qsl(parts.query)),
    }


if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": database_from_url(os.environ["DATABASE_URL"])}
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "db.sqlite3",
            # IMMEDIATE takes the write lock when a transaction starts, so the web
            # process and the worker queue up for it instead of failing with
            # "database is locked" halfway through; WAL lets readers go on meanwhile.
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL;",
            },
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Celery, configured from these CELERY_* settings by example_project/celery.py.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://localhost/")
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's filesystem transport with atomic writes and takes (see broker.py).
    CELERY_BROKER_TRANSPORT = "example_project.broker:Transport"
    _broker_dir = VAR_DIR / "broker"
    for _folder in ("queue", "taken", "processed", "control"):
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # One folder in and out: every process (web, workers, beat) shares the same queues.
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
        "polling_interval": 0.1,
    }
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_IGNORE_RESULT = True  # workflow results live in the database
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_DB_REUSE_MAX = 1000  # keep database connections between tasks

AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = []  # the demo user is admin/admin

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        # propagate=False: Celery's worker also logs the root logger; print each line once.
        # scripts/run-example sets WEFT_LOG_LEVEL=WARNING: the console then shows what the
        # workflows and the demo app say (the two INFO loggers below), not every turn.
        "django_weft": {
            "handlers": ["console"],
            "level": os.environ.get("WEFT_LOG_LEVEL", "INFO"),
            "propagate": False,
        },
        "django_weft.workflow": {"level": "INFO"},  # ctx.logger: the workflows' own lines
        "example_project": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
