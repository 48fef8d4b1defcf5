"""Smaller odd inputs a client can send, each answered as a clear client error (or taken
as meant), over real HTTP on both databases."""

from __future__ import annotations

import base64
import http.client
from urllib.parse import urlsplit

import pytest

from django_weft import InvalidInput, client
from django_weft.models import Signal, WorkflowRun

from .conftest import Api


def test_an_execution_timeout_of_zero_is_refused(api: Api) -> None:
    response = api.post("runs/", {"workflow": "tests.sleepy", "execution_timeout": 0})
    assert response.status_code == 400
    assert "execution_timeout" in response.json()["error"]["message"]
    with pytest.raises(InvalidInput, match="longer than 0 seconds"):
        client.start("tests.sleepy", execution_timeout="0s")
    assert WorkflowRun.objects.count() == 0


def test_an_over_long_duration_string_is_refused(api: Api) -> None:
    response = api.post("runs/", {"workflow": "tests.sleepy", "start_delay": "1h" * 5000})
    assert response.status_code == 400
    assert "at most 100" in response.json()["error"]["message"]
    assert WorkflowRun.objects.count() == 0


def test_a_utf8_idempotency_key_is_stored_as_sent(api: Api) -> None:
    api.post("runs/", {"workflow": "tests.sleepy", "id": "keyed"})
    # requests would encode the header as Latin-1; send the UTF-8 bytes as a client does.
    parts = urlsplit(api.url("runs/keyed/signal/"))
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port)
    body = b'{"name": "poke", "payload": 1}'
    connection.putrequest("POST", parts.path)
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(len(body)))
    connection.putheader("Authorization", _basic(api))
    connection.putheader("Idempotency-Key", "caf\u00e9-\u2603".encode())
    connection.endheaders(body)
    response = connection.getresponse()
    assert response.status == 202, response.read()
    assert list(Signal.objects.values_list("signal_id", flat=True)) == ["caf\u00e9-\u2603"]


def test_an_idempotency_key_that_is_not_utf8_is_refused(api: Api) -> None:
    api.post("runs/", {"workflow": "tests.sleepy", "id": "keyed"})
    response = api.post("runs/keyed/signal/", {"name": "poke"}, headers={"Idempotency-Key": b"\xff\xfe"})
    assert response.status_code == 400
    assert "not UTF-8 text" in response.text
    assert Signal.objects.count() == 0


def _basic(api: Api) -> str:
    assert api.auth is not None
    return "Basic " + base64.b64encode(f"{api.auth[0]}:{api.auth[1]}".encode()).decode()
