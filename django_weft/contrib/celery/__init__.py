"""Celery integration: workers run turns and queued activities, beat drives the sweep.

Add ``"django_weft.contrib.celery"`` to ``INSTALLED_APPS`` (after ``"django_weft"``) and
merge the beat entry into your Celery app::

    # proj/celery.py
    import os
    from celery import Celery

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
    app = Celery("proj")
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.autodiscover_tasks()

    from django_weft.contrib.celery import beat_schedule

    app.conf.beat_schedule = {**app.conf.beat_schedule, **beat_schedule()}

With the app installed, ``WEFT_DISPATCHER`` defaults to
:class:`~django_weft.contrib.celery.dispatch.CeleryDispatcher`.
"""

from __future__ import annotations

from typing import Any

from ...extras import require_extra

require_extra("celery", "django_weft.contrib.celery", "celery")

TICK_TASK = "django_weft.tick"
TURN_TASK = "django_weft.run_turn"
ACTIVITY_TASK = "django_weft.run_activity"
GC_TASK = "django_weft.gc"

GC_INTERVAL = 300.0
"""Seconds between the beat's retention runs (``django_weft.gc``)."""


def beat_schedule() -> dict[str, dict[str, Any]]:
    """The beat entries to merge into ``app.conf.beat_schedule``: the sweep (``tick``)
    every ``WEFT_TICK_INTERVAL`` seconds, and retention (``gc``: delete the terminal runs
    past their retention, every due one) every ``GC_INTERVAL`` seconds.

    A message expires after a few intervals of its entry (a gc one after one), so they do
    not pile up in the broker while no worker runs; the next one does the same work.
    Several beats may run at once (the sweep and retention lock rows with ``SKIP LOCKED``,
    so nothing fires or is deleted twice)."""
    from ...conf import weft_settings

    interval = weft_settings.TICK_INTERVAL
    options: dict[str, Any] = {"expires": max(interval * 5, 5.0)}
    gc_options: dict[str, Any] = {"expires": GC_INTERVAL}
    if weft_settings.CELERY_QUEUE:
        options["queue"] = gc_options["queue"] = weft_settings.CELERY_QUEUE
    return {
        TICK_TASK: {"task": TICK_TASK, "schedule": interval, "options": options},
        GC_TASK: {"task": GC_TASK, "schedule": GC_INTERVAL, "options": gc_options},
    }
