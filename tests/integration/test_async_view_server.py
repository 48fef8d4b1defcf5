"""An async view under a real ASGI server (uvicorn), with runs executed by a real
``weft_worker``: concurrent requests start, signal and await runs with the async client,
holding no database connection each while they wait."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_weft import client
from django_weft.models import Signal
from tests.support.processes import REPO, GroupProcess, WorkerProcess

from .conftest import free_port, wait_for

pytest.importorskip("uvicorn")

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

APPLICATION_NAME = "weft-asgi-test"


@pytest.fixture
def asgi_server(tmp_path: Path) -> Iterator[str]:
    """uvicorn serving tests.asgi on the test database; yields its base URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(REPO))
    if connection.vendor == "sqlite":
        env.update(WEFT_TEST_DB="sqlite", WEFT_TEST_SQLITE_NAME=str(connection.settings_dict["NAME"]))
    else:
        env.update(
            WEFT_TEST_DB="postgres",
            WEFT_TEST_PG_NAME=str(connection.settings_dict["NAME"]),
            WEFT_TEST_PG_APPLICATION_NAME=APPLICATION_NAME,
        )
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "tests.asgi:application",
        "--port",
        str(port),
        "--log-level",
        "info",
    ]
    server = GroupProcess(tmp_path / "uvicorn.log", argv, env)

    def listening() -> bool:
        if not server.alive():
            raise AssertionError(f"uvicorn exited:\n{server.log}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(listening, 30, "uvicorn to listen")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def post_greet(url: str, name: str) -> tuple[int, dict[str, Any]]:
    data = json.dumps({"greeting": "Hello", "name": name, "wait": 60}).encode()
    request = urllib.request.Request(
        f"{url}/async/greet/", data=data, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=90) as response:
        return response.status, json.loads(response.read())


def server_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [APPLICATION_NAME]
        )
        return int(cursor.fetchone()[0])


def test_concurrent_async_views_under_uvicorn_wait_for_runs_a_worker_completes(
    asgi_server: str,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    requests = 20
    responses: list[tuple[int, dict[str, Any]]] = []
    lock = threading.Lock()

    def one(index: int) -> None:
        answer = post_greet(asgi_server, f"guest {index}")
        with lock:
            responses.append(answer)

    threads = [threading.Thread(target=one, args=(index,)) for index in range(requests)]
    for thread in threads:
        thread.start()
    # Every view has started its run and signalled it: they all wait now (no worker yet).
    wait_for(lambda: Signal.objects.filter(name="name").count() == requests, 30, "every view to signal")
    counts = []
    if connection.vendor == "postgresql":
        for _ in range(5):
            counts.append(server_connections())
            threading.Event().wait(0.2)
        print(f"\n{requests} async views waiting under uvicorn: the server's connections: {counts}")
        assert max(counts) <= 2, counts
    start_worker()
    for thread in threads:
        thread.join(90)
    assert len(responses) == requests
    assert all(status == 200 for status, _ in responses), responses
    assert sorted(body["result"] for _, body in responses) == sorted(
        f"Hello, guest {i}" for i in range(requests)
    )

    # An async def activity queued on the worker process.
    handle = client.start("tests.async.queued", args=["on the worker"])
    assert handle.result(timeout=30)["value"] == "on the worker"
