"""The Celery contrib app's configuration surface (no worker needed)."""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.test import override_settings

from django_weft.conf import weft_settings
from django_weft.contrib.celery import GC_TASK, TICK_TASK, beat_schedule
from django_weft.contrib.celery.dispatch import CeleryDispatcher, message_priority


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


def test_a_runs_priority_becomes_the_message_priority_each_broker_orders_by() -> None:
    assert [message_priority("amqp://h//", p) for p in (-100, 0, 1, 50, 100)] == [None, None, 1, 5, 9]
    assert [message_priority("redis://h/0", p) for p in (-100, -50, -1, 0, 100)] == [9, 5, 1, None, None]
    assert message_priority("memory://", 100) is None


@contextlib.contextmanager
def _broker(url: str, **transport_options: object) -> Iterator[None]:
    """The test app's Celery publishing to ``url`` with these transport options, for a while."""
    from celery import current_app
    from kombu import pools

    conf = current_app.conf
    previous = conf.broker_url, conf.broker_transport_options

    def reset() -> None:
        pools.reset()
        current_app._pool = None
        current_app.amqp._producer_pool = None

    conf.broker_url, conf.broker_transport_options = url, transport_options
    reset()
    try:
        yield
    finally:
        conf.broker_url, conf.broker_transport_options = previous
        reset()


def _delivered_in_order(url: str, queue: Any, count: int, **transport_options: object) -> list[str]:
    from kombu import Connection

    order: list[str] = []
    with Connection(url, transport_options=transport_options) as conn:
        # Publishing does not wait for the broker to queue the message: consuming before
        # all of them are queued would see them in the order they arrived instead.
        deadline = time.monotonic() + 10
        while (queued := queue(conn.channel()).queue_declare(passive=True).message_count) < count:
            assert time.monotonic() < deadline, f"{queued} of the {count} turns reached the broker's queue"
            time.sleep(0.05)

    def received(body: Any, message: Any) -> None:
        order.append(body[0][0])
        message.ack()

    with (
        Connection(url, transport_options=transport_options) as conn,
        conn.Consumer(queue, accept=["json"], callbacks=[received]),
    ):
        deadline = time.monotonic() + 10
        while len(order) < count and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError, socket.timeout):
                conn.drain_events(timeout=1)
    return order


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_turns_reach_a_real_broker_with_their_priority_and_leave_it_in_that_order(
    broker: str, caplog: pytest.LogCaptureFixture
) -> None:
    from kombu import Queue

    name = f"weft-priority-{uuid.uuid4().hex[:8]}"
    if broker == "redis":
        url = "redis://127.0.0.1:6379/14"
        options: dict[str, object] = {"priority_steps": list(range(10)), "queue_order_strategy": "priority"}
        queue = Queue(name)
        sent = [-100, -10, 0]  # Redis orders what it can: priorities below 0 go last
    else:
        url = "amqp://guest:guest@127.0.0.1:5672//"
        options = {}
        queue = Queue(name, queue_arguments={"x-max-priority": 10})
        sent = [0, 10, 100]  # RabbitMQ orders what it can: priorities above 0 go first
    try:
        from kombu import Connection

        with Connection(url, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1)
            queue(conn.channel()).declare()
    except Exception as exc:
        pytest.skip(f"{broker} is not answering at {url}: {exc}")
    from celery import current_app

    ids = {priority: str(uuid.uuid4()) for priority in sent}
    current_app.amqp.queues.add(queue)  # as a project's task_queues would declare it
    try:
        with (
            _broker(url, **options),
            override_settings(WEFT_CELERY_QUEUE=name),
            caplog.at_level("DEBUG", logger="django_weft.celery"),
        ):
            for priority in sent:
                CeleryDispatcher().dispatch_turn(ids[priority], priority=priority)
        published = [record.getMessage() for record in caplog.records if record.name == "django_weft.celery"]
        assert len([line for line in published if line.startswith("sent ")]) == len(sent), published
        got = _delivered_in_order(url, queue, len(sent), **options)
    finally:
        current_app.amqp.queues.pop(name, None)
        with Connection(url) as conn:
            queue(conn.channel()).delete()
        if broker == "redis":
            import redis

            client = redis.Redis.from_url(url)
            client.delete(*client.keys(f"*{name}*") or ["-"])
    assert got == [ids[p] for p in sorted(sent, reverse=True)]
