"""The example project's embedded broker (``example_project/broker.py``) under concurrent
producers and consumers in separate processes: every message is delivered exactly once,
whole, and no consumer fails.

kombu's stock filesystem transport fails this test: a consumer reads a message file
that its producer has created but not yet written, and raises a JSON error.
"""

from __future__ import annotations

import multiprocessing
import queue
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.database_independent]

PRODUCERS = 3
CONSUMERS = 3
MESSAGES_EACH = 400
TRANSPORT = "example_project.broker:Transport"


def _connection(folder: str) -> Any:
    from kombu import Connection

    options = {
        "data_folder_in": f"{folder}/queue",
        "data_folder_out": f"{folder}/queue",
        "control_folder": f"{folder}/control",
        "polling_interval": 0.001,
    }
    return Connection("filesystem://localhost/", transport=TRANSPORT, transport_options=options)


def _produce(folder: str, producer: int) -> None:
    with _connection(folder) as connection:
        bus = connection.SimpleQueue("orders")
        for number in range(MESSAGES_EACH):
            # A payload of some size, so that writing it takes a moment.
            bus.put({"id": f"{producer}-{number}", "pad": "x" * 4096})
        bus.close()


def _consume(folder: str, results: Any, stop: Any) -> None:
    try:
        with _connection(folder) as connection:
            bus = connection.SimpleQueue("orders")
            while not stop.is_set():
                try:
                    message = bus.get(timeout=0.05)
                except queue.Empty:
                    continue
                results.put(("ok", message.payload["id"], len(message.payload["pad"])))
                message.ack()
            bus.close()
    except Exception as exc:
        results.put(("error", repr(exc), 0))


def test_concurrent_producers_and_consumers_get_every_message_once_and_whole(tmp_path: Path) -> None:
    for name in ("queue", "control"):
        (tmp_path / name).mkdir()
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    stop = context.Event()
    consumers = [
        context.Process(target=_consume, args=(str(tmp_path), results, stop)) for _ in range(CONSUMERS)
    ]
    producers = [context.Process(target=_produce, args=(str(tmp_path), index)) for index in range(PRODUCERS)]
    for process in consumers + producers:
        process.start()
    expected = PRODUCERS * MESSAGES_EACH
    received: list[str] = []
    errors: list[str] = []
    try:
        while len(received) < expected and not errors:
            kind, value, size = results.get(timeout=60)
            if kind == "error":
                errors.append(value)
            else:
                assert size == 4096
                received.append(value)
    finally:
        stop.set()
        for process in producers + consumers:
            process.join(30)
            if process.is_alive():
                process.kill()
    assert not errors, errors
    assert sorted(received) == sorted(f"{p}-{n}" for p in range(PRODUCERS) for n in range(MESSAGES_EACH))
    assert not list((tmp_path / "queue").glob("*.msg"))
