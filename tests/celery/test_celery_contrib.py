"""The Celery contrib app's configuration surface (no worker needed)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.test import override_settings

from django_weft.conf import weft_settings
from django_weft.contrib.celery import GC_TASK, TICK_TASK, beat_schedule
from django_weft.contrib.celery.dispatch import CeleryDispatcher


def test_with_the_contrib_app_installed_the_default_dispatcher_is_celerys() -> None:
    with override_settings():
        del settings.WEFT_DISPATCHER
        assert weft_settings.DISPATCHER == "django_weft.contrib.celery.dispatch.CeleryDispatcher"
    apps = [app for app in settings.INSTALLED_APPS if app != "django_weft.contrib.celery"]
    with override_settings(INSTALLED_APPS=apps):
        del settings.WEFT_DISPATCHER
        assert weft_settings.DISPATCHER == "django_weft.runtime.dispatch.SweepOnlyDispatcher"


def test_beat_schedule_runs_the_tick_every_tick_interval_and_gc_every_5_minutes() -> None:
    with override_settings(WEFT_TICK_INTERVAL="2s", WEFT_CELERY_QUEUE="weft"):
        entries = beat_schedule()
    assert entries == {
        TICK_TASK: {"task": TICK_TASK, "schedule": 2.0, "options": {"expires": 10.0, "queue": "weft"}},
        GC_TASK: {"task": GC_TASK, "schedule": 300.0, "options": {"expires": 300.0, "queue": "weft"}},
    }


@pytest.mark.parametrize("queue", ["", "  ", 7])
def test_a_bad_celery_queue_is_a_system_check_error(queue: object) -> None:
    with override_settings(WEFT_CELERY_QUEUE=queue):
        assert "django_weft.E017" in [message.id for message in run_checks()]


@pytest.mark.django_db(transaction=True)
def test_activity_time_limits_follow_the_activity_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_weft.contrib.celery import tasks

    sent: list[tuple[tuple[object, ...], dict[str, object]]] = []

    def record(args: tuple[object, ...], **options: object) -> None:
        sent.append((args, options))

    monkeypatch.setattr(tasks.run_activity, "apply_async", record)
    CeleryDispatcher().dispatch_activity("r", 3, 2, queue="emails", timeout=30.0)
    CeleryDispatcher().dispatch_activity("r", 4, 1, queue="emails")
    assert sent[0][0] == ("r", 3, 2)
    assert {k: sent[0][1][k] for k in ("queue", "soft_time_limit", "time_limit")} == {
        "queue": "emails", "soft_time_limit": 30.0, "time_limit": 35.0,
    }  # fmt: skip
    assert "soft_time_limit" not in sent[1][1]


@pytest.mark.django_db(transaction=True)
def test_a_broker_that_cannot_be_reached_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    from celery import current_app

    with override_settings(WEFT_DISPATCHER="django_weft.contrib.celery.dispatch.CeleryDispatcher"):
        previous = current_app.conf.broker_url
        current_app.conf.broker_url = "redis://127.0.0.1:1/0"  # nothing listens there
        try:
            from kombu import pools

            pools.reset()
            current_app._pool = None
            current_app.amqp._producer_pool = None
            with caplog.at_level("WARNING", logger="django_weft.celery"):
                CeleryDispatcher().dispatch_turn("00000000-0000-0000-0000-000000000001")
        finally:
            current_app.conf.broker_url = previous
            pools.reset()
            current_app._pool = None
            current_app.amqp._producer_pool = None
    assert any("the sweep sends it again" in record.getMessage() for record in caplog.records)
