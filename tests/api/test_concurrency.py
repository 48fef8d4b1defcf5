"""Concurrent clients over real HTTP: duplicate starts and long polls."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection

from django_weft import client, runtime
from django_weft.models import WorkflowRun

from .conftest import Api

pytestmark = pytest.mark.django_db(transaction=True)


def test_twenty_concurrent_starts_with_one_id_create_one_run(api: Api) -> None:
    barrier = threading.Barrier(20)

    def start(_: int) -> tuple[int, str]:
        barrier.wait()
        response = api.post("runs/", {"workflow": "tests.sleepy", "id": "one-of-twenty"})
        return response.status_code, response.json()["run_id"]

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(start, range(20)))
    assert {run_id for _, run_id in answers} == {answers[0][1]}
    assert sorted(code for code, _ in answers) == [200] * 19 + [201]
    assert WorkflowRun.objects.filter(workflow_id="one-of-twenty").count() == 1


@pytest.mark.postgres
@pytest.mark.parametrize("atomic_requests", [False, True])
def test_a_long_poll_holds_no_transaction_and_returns_within_its_wait(
    api: Api, atomic_requests: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The settings dict is shared with the server thread's connection: with
    # ATOMIC_REQUESTS on, the project wraps views in a transaction unless they opt out.
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", atomic_requests)
    run = client.start("tests.sleepy", kwargs={"seconds": 60})
    outcome: dict[str, Any] = {}

    def poll() -> None:
        started = time.monotonic()
        response = api.get(f"runs/{run.run_id}/result/?wait=5")
        outcome.update(status=response.status_code, body=response.json(), took=time.monotonic() - started)

    # The sampling starts once the request is inside its wait (the view has called result_of).
    polling = threading.Event()
    result_of = runtime.result_of

    def result_of_then_signal(*args: Any, **kwargs: Any) -> Any:
        # The server thread's own connection: other threads of this process (a worker's
        # heartbeat) may query the database meanwhile, and are not what is sampled.
        connection.ensure_connection()
        outcome["pid"] = connection.connection.info.backend_pid
        polling.set()
        return result_of(*args, **kwargs)

    monkeypatch.setattr(runtime, "result_of", result_of_then_signal)
    poller = threading.Thread(target=poll)
    poller.start()
    assert polling.wait(10), "the poll did not reach the view's wait"
    states = []
    with connection.cursor() as cursor:
        for _ in range(15):
            # A look in flight is a statement with its own short transaction; a held
            # transaction shows as "idle in transaction" or as a transaction seconds old.
            cursor.execute(
                "SELECT state, COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - xact_start), 0)"
                " FROM pg_stat_activity WHERE pid = %s",
                [outcome["pid"]],
            )
            states.extend(cursor.fetchall())
            time.sleep(0.2)
    # Meanwhile a transition that locks the run row goes through at once.
    started = time.monotonic()
    client.get_handle(run.run_id).suspend()
    assert time.monotonic() - started < 1.0
    poller.join(15)
    assert outcome["status"] == 202 and outcome["body"] == {"status": "suspended"}
    assert 4.9 <= outcome["took"] <= 5.5, outcome["took"]
    assert states, "the poller's connection was not seen"
    assert all(age < 0.5 for _, age in states), states
    assert any(state == "idle" for state, _ in states), states
    assert not any(state.startswith("idle in transaction") for state, _ in states), states


def test_wait_is_capped_by_the_setting(api: Api, settings: Any) -> None:
    settings.WEFT_API_MAX_WAIT = 0.5
    run = client.start("tests.sleepy", kwargs={"seconds": 60})
    started = time.monotonic()
    response = api.get(f"runs/{run.run_id}/result/?wait=30")
    assert response.status_code == 202
    assert time.monotonic() - started < 2.0
