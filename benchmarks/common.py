"""What the PostgreSQL benchmarks share: a connection to the server's ``postgres``
database, a benchmark database made afresh, and Django configured on it with the
migrations applied.

Connection settings come from PGHOST, PGPORT, PGUSER and PGPASSWORD (default
127.0.0.1:5432, user postgres).
"""

from __future__ import annotations

import os
from typing import Any

import psycopg


def database_settings(name: str) -> dict[str, Any]:
    """A ``DATABASES`` entry for database ``name`` on the benchmark's server (PGHOST...),
    with persistent connections, as a deployment would keep them."""
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": os.environ.get("PGUSER", "postgres"),
        "PASSWORD": os.environ.get("PGPASSWORD", ""),
        "HOST": os.environ.get("PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("PGPORT", "5432"),
        "CONN_MAX_AGE": None,
    }


def admin_connection() -> psycopg.Connection[Any]:
    """An autocommit connection to the server's ``postgres`` database."""
    return psycopg.connect(
        host=os.environ.get("PGHOST", "127.0.0.1"),
        port=int(os.environ.get("PGPORT", "5432")),
        user=os.environ.get("PGUSER", "postgres"),
        password=os.environ.get("PGPASSWORD", ""),
        dbname="postgres",
        autocommit=True,
    )


def drop_database(name: str) -> None:
    """Close Django's connections and drop ``name``, whoever is connected to it."""
    from django.db import connections

    connections.close_all()
    with admin_connection() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


ADMIN_APPS = ["django.contrib.admin", "django.contrib.messages", "django.contrib.staticfiles"]
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


def setup_django(database: str, *, urlconf: str, admin: bool = False, keep: bool = False) -> None:
    """Create ``database`` afresh (with ``keep``, reuse it if it exists), configure Django
    on it with django_weft, the REST framework (session authentication: the timing is
    the view's, not a password hash's) and, with ``admin``, the admin site, and migrate.
    Runs are dispatched by the sweep only, and no ``workflows`` module is autodiscovered:
    each benchmark registers what it runs."""
    import django
    from django.conf import settings
    from django.core.management import call_command

    with admin_connection() as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if not (keep and exists):
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {database}")
    extra: dict[str, Any] = {"TEMPLATES": TEMPLATES, "STATIC_URL": "static/"} if admin else {}
    settings.configure(
        DEBUG=False,
        SECRET_KEY="benchmark-only",
        USE_TZ=True,
        TIME_ZONE="UTC",
        ALLOWED_HOSTS=["testserver"],
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django.contrib.sessions",
            *(ADMIN_APPS if admin else []),
            "rest_framework",
            "django_weft",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            *(["django.contrib.messages.middleware.MessageMiddleware"] if admin else []),
        ],
        ROOT_URLCONF=urlconf,
        DATABASES={"default": database_settings(database)},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        WEFT_AUTODISCOVER_MODULE=None,
        WEFT_DISPATCHER="django_weft.runtime.dispatch.SweepOnlyDispatcher",
        REST_FRAMEWORK={
            "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication"]
        },
        LOGGING_CONFIG=None,
        **extra,
    )
    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
