"""``POST runs/{ref}/cancel/`` with ``"mode": "request"``: the workflow receives the request
and cleans up before it finishes cancelled."""

from __future__ import annotations

from typing import Any

from tests.testapp.models import SideEffect

from ..integration.conftest import wait_for
from .conftest import Api


def _status(api: Api, ref: str) -> str:
    return str(api.get(f"runs/{ref}/").json()["status"])


def test_a_cancellation_request_lets_the_workflow_clean_up(api: Api, driver: Any) -> None:
    ref = api.post("runs/", {"workflow": "tests.x.saga", "args": ["api"], "id": "saga-api"}).json()["run_id"]
    wait_for(lambda: _status(api, ref) == "waiting", 20, "the run to sleep")
    assert api.get(f"runs/{ref}/").json()["cancel_request"] is None

    requested = api.post(f"runs/{ref}/cancel/", {"reason": "ops", "mode": "request"})
    assert requested.status_code == 200, requested.text
    assert requested.json()["status"] == "running"  # woken from its one-hour sleep
    request = requested.json()["run"]["cancel_request"]
    assert request["reason"] == "ops" and request["requested_at"]

    wait_for(lambda: _status(api, ref) == "cancelled", 20, "the run to finish cancelled")
    assert SideEffect.objects.filter(key="api:release").count() == 1
    outcome = api.get(f"runs/{ref}/result/")
    assert outcome.status_code == 409 and outcome.json()["error"]["code"] == "run_cancelled"
    assert outcome.json()["error"]["details"]["reason"] == "ops"
    entries = api.get(f"runs/{ref}/history/").json()["results"]
    received = [entry for entry in entries if entry["kind"] == "cancel_request"]
    assert len(received) == 1 and received[0]["result"]["reason"] == "ops"
    assert api.get(f"runs/{ref}/").json()["cancel_request"]["seq"] == received[0]["seq"]

    again = api.post(f"runs/{ref}/cancel/", {"mode": "request"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"


def test_the_cancel_mode_is_checked(api: Api) -> None:
    ref = api.post("runs/", {"workflow": "tests.x.saga", "args": ["api-bad"]}).json()["run_id"]
    bad = api.post(f"runs/{ref}/cancel/", {"mode": "politely"})
    assert bad.status_code == 400, bad.text
    assert bad.json()["error"]["code"] == "invalid" and "mode" in bad.json()["error"]["details"]["fields"]
    nul = api.post(f"runs/{ref}/cancel/", {"reason": "a\u0000b", "mode": "request"})
    assert nul.status_code == 400, nul.text
    assert api.get(f"runs/{ref}/").json()["cancel_request"] is None
    terminated = api.post(f"runs/{ref}/cancel/", {"mode": "terminate"})
    assert terminated.status_code == 200 and terminated.json()["status"] == "cancelled"
