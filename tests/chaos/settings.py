"""Settings of the chaos run's processes: the suite's settings on a PostgreSQL cluster and
a Redis server of the run's own (``WEFT_CHAOS_PG_PORT``, ``WEFT_CHAOS_BROKER_URL``, set by
the harness), the Celery dispatcher, and the workload app."""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "chaos",
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": os.environ.get("WEFT_CHAOS_PG_PORT", "5432"),
        # Kept between tasks, as a deployment would; a restart of the server breaks them,
        # and Django replaces a broken connection at the next request or task.
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
    }
}

WEFT_DISPATCHER = "django_weft.contrib.celery.dispatch.CeleryDispatcher"
CELERY_BROKER_URL = os.environ.get("WEFT_CHAOS_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None  # a broker outage is waited out, not fatal

# Leases: TTL 3 s renewed every 0.5 s (the suite's); a process stopped longer than
# TTL + grace is deposed while it sleeps.
WEFT_LEASE_TTL = 3
WEFT_LEASE_RENEW_INTERVAL = 0.5
WEFT_TAKEOVER_GRACE = 0.5
WEFT_TICK_INTERVAL = 0.5
WEFT_REDISPATCH_AFTER = 2
