"""Bad input over real HTTP: the error envelope, the right status and code, nothing written."""

from __future__ import annotations

import base64
import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests

from django_weft import client
from django_weft.models import Schedule, Signal, Step, Update, WorkflowRun

from .conftest import Api

pytestmark = pytest.mark.django_db(transaction=True)


def _snapshot() -> tuple[int, int, int, int]:
    return (WorkflowRun.objects.count(), Step.objects.count(), Signal.objects.count(), Update.objects.count())


def _error(response: requests.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}, body
    assert body["error"]["code"] == code, body
    assert body["error"]["message"]
    return dict(body["error"])


def test_malformed_json_and_wrong_types_are_400_invalid(api: Api) -> None:
    before = _snapshot()
    url = api.url("runs/")
    malformed = requests.post(
        url, data=b'{"workflow": ', headers={"Content-Type": "application/json"}, auth=api.auth, timeout=10
    )
    _error(malformed, 400, "invalid")
    wrong = api.post("runs/", {"workflow": "tests.echo", "args": "not a list", "kwargs": [1]})
    details = _error(wrong, 400, "invalid")["details"]
    assert set(details["fields"]) == {"args", "kwargs"}
    missing = api.post("runs/", {"args": []})
    assert "workflow" in _error(missing, 400, "invalid")["details"]["fields"]
    not_object = api.post("runs/", [1, 2])
    _error(not_object, 400, "invalid")
    nan = requests.post(
        url,
        data=b'{"workflow": "tests.echo", "args": [NaN]}',
        headers={"Content-Type": "application/json"},
        auth=api.auth,
        timeout=10,
    )
    _error(nan, 400, "invalid")
    form = requests.post(url, data={"workflow": "tests.echo"}, auth=api.auth, timeout=10)
    _error(form, 415, "unsupported_media_type")
    assert _snapshot() == before


def test_unknown_workflow_unknown_run_bad_duration_and_bad_id(api: Api) -> None:
    before = _snapshot()
    _error(api.post("runs/", {"workflow": "no.such.workflow"}), 400, "unknown_workflow")
    _error(api.get("runs/no-such-run/"), 404, "not_found")
    _error(api.post("runs/no-such-run/signal/", {"name": "x"}), 404, "not_found")
    _error(api.post("runs/", {"workflow": "tests.echo", "start_delay": "soon"}), 400, "invalid")
    _error(api.post("runs/", {"workflow": "tests.echo", "execution_timeout": True}), 400, "invalid")
    _error(api.post("runs/", {"workflow": "tests.echo", "id": "   "}), 400, "invalid")
    _error(api.post("runs/", {"workflow": "tests.echo", "on_conflict": "whatever"}), 400, "invalid")
    _error(api.get("runs/?status=sleeping"), 400, "invalid")
    _error(api.get("runs/?search.bad%20name=1"), 400, "invalid")
    _error(api.get("runs/?cursor=garbage"), 404, "not_found")
    _error(requests.delete(api.url("runs/"), auth=api.auth, timeout=10), 405, "method_not_allowed")
    assert _snapshot() == before


def test_wait_that_is_not_a_number_and_after_seq_that_is_not_an_integer(api: Api) -> None:
    run = client.start("tests.sleepy")
    _error(api.get(f"runs/{run.run_id}/result/?wait=soon"), 400, "invalid")
    _error(api.get(f"runs/{run.run_id}/result/?wait=-1"), 400, "invalid")
    _error(api.get(f"runs/{run.run_id}/result/?wait=nan"), 400, "invalid")
    _error(api.get(f"runs/{run.run_id}/history/?after_seq=x"), 400, "invalid")
    _error(api.post(f"runs/{run.run_id}/update/", {"name": "x", "wait": "long"}), 400, "invalid")


def test_already_exists_and_terminal_conflicts(api: Api) -> None:
    api.post("runs/", {"workflow": "tests.sleepy", "id": "taken"})
    _error(
        api.post("runs/", {"workflow": "tests.sleepy", "id": "taken", "on_conflict": "fail"}),
        409,
        "already_exists",
    )
    client.get_handle("taken").cancel()
    before = _snapshot()
    _error(api.post("runs/taken/signal/", {"name": "x"}), 409, "conflict")
    _error(api.post("runs/taken/suspend/"), 409, "conflict")
    assert _snapshot() == before


def test_an_update_rejected_by_its_validator_is_400_with_issues_and_writes_nothing(
    api: Api, driver: Any
) -> None:
    api.post("runs/", {"workflow": "tests.m.cart", "args": ["v"], "id": "cart-v"})
    deadline = time.monotonic() + 20
    while api.get("runs/cart-v/").json()["status"] != "waiting":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    before = _snapshot()
    rejected = api.post("runs/cart-v/update/", {"name": "address", "payload": {"street": "x"}, "wait": 5})
    issues = _error(rejected, 400, "validation_failed")["details"]["issues"]
    assert issues and "city" in issues[0]["message"]
    assert _snapshot() == before
    failed = api.post("runs/cart-v/update/", {"name": "broken", "wait": 20})
    error = _error(failed, 422, "update_failed")
    assert error["details"]["type"] and "ZeroDivisionError" in error["details"]["type"]
    unknown = api.post("runs/cart-v/query/", {"name": "nope"})
    assert _error(unknown, 400, "unknown_handler")["details"]["registered"] == ["count", "state"]


def test_oversized_bodies_are_413_from_the_declared_length_without_reading(api: Api, settings: Any) -> None:
    settings.WEFT_API_MAX_BODY_BYTES = 1000
    before = _snapshot()
    big = api.post("runs/", {"workflow": "tests.echo", "args": ["x" * 2000]})
    _error(big, 413, "payload_too_large")
    # A declared length over the limit and a body that never comes: answered at once.
    parts = urlsplit(api.url("runs/"))
    started = time.monotonic()
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(
            (
                f"POST {parts.path} HTTP/1.1\r\nHost: {parts.hostname}\r\n"
                "Content-Type: application/json\r\nContent-Length: 50000000\r\n"
                "Authorization: Basic b3BzOmNvcnJlY3QgaG9yc2UgYmF0dGVyeSBzdGFwbGU=\r\n\r\n"
            ).encode()
        )
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
            if b'"payload_too_large"' in b"".join(chunks):
                break
        reply = b"".join(chunks).decode(errors="replace")
    assert time.monotonic() - started < 5
    assert reply.startswith("HTTP/1.1 413"), reply[:200]
    assert '"payload_too_large"' in reply
    assert _snapshot() == before


def test_the_envelope_is_for_django_weft_views_only(api: Api, live_server: Any) -> None:
    # The admin (a non-DRF view of the same project) keeps its own answers.
    response = requests.get(f"{live_server.url}/admin/", timeout=10, allow_redirects=False)
    assert response.status_code == 302


@pytest.mark.parametrize("bad", ["nul\u0000inside", "lone \ud800 surrogate"], ids=["nul", "surrogate"])
def test_strings_no_database_can_store_are_refused_with_nothing_written(api: Api, bad: str) -> None:
    from django_weft import PayloadError

    before = _snapshot()
    # Python's json module writes both as \u escapes, as a client library would.
    body = json.dumps({"workflow": "tests.echo", "args": [bad]}).encode()
    response = requests.post(
        api.url("runs/"), data=body, headers={"Content-Type": "application/json"}, auth=api.auth, timeout=10
    )
    assert "NUL" in _error(response, 400, "invalid")["message"] or "surrogate" in response.text
    with pytest.raises(PayloadError):
        client.start("tests.echo", args=[bad])
    with pytest.raises(PayloadError):
        client.start("tests.echo", kwargs={"note": {"deep": [bad]}})
    with pytest.raises(PayloadError):
        client.start("tests.echo", search_attributes={bad: 1})
    run = client.start("tests.sleepy", kwargs={"seconds": 60})
    with pytest.raises(PayloadError):
        client.get_handle(run.run_id).signal("poke", {"text": bad})
    assert _snapshot()[0] == before[0] + 1 and _snapshot()[1:] == before[1:]


def test_a_lone_surrogate_echoed_in_an_error_is_escaped_not_a_500(api: Api) -> None:
    """DRF's messages quote a bad choice, and a schedule body names an unknown key: JSON
    can carry a lone surrogate there, a UTF-8 response cannot."""
    before = _snapshot()
    for path, body in [
        ("runs/", b'{"workflow": "tests.echo", "on_conflict": "\\ud800"}'),
        ("schedules/", b'{"id": "x", "workflow": "tests.echo", "every": 60, "overlap": "x\\udfff"}'),
        ("schedules/", b'{"id": "x", "workflow": "tests.echo", "every": 60, "\\ud800": 1}'),
    ]:
        fields = _error(_post_raw(api, path, body), 400, "invalid")["details"]["fields"]
        assert "\\ud800" in json.dumps(fields) or "\\udfff" in json.dumps(fields), fields
    assert _snapshot() == before and not Schedule.objects.exists()


def _post_raw(api: Api, path: str, body: bytes, content_type: str = "application/json") -> requests.Response:
    return requests.post(
        api.url(path), data=body, headers={"Content-Type": content_type}, auth=api.auth, timeout=30
    )


def test_hostile_bodies_are_refused_without_a_500(api: Api) -> None:
    before = _snapshot()
    # Nesting that would exhaust the parser's or the encoder's stack, and plain deep nesting.
    _error(_post_raw(api, "runs/", b"[" * 200_000), 400, "invalid")
    deep = b'{"workflow": "tests.echo", "args": ' + b"[" * 950 + b"]" * 950 + b"}"
    _error(_post_raw(api, "runs/", deep), 400, "invalid")
    _error(
        _post_raw(api, "runs/", b'{"workflow": "tests.echo", "args": ' + b"[" * 70 + b"]" * 70 + b"}"),
        400,
        "invalid",
    )
    # Charsets that are not text: refused before decoding (zlib would inflate the body).
    body = b'{"workflow": "tests.echo"}'
    for charset in ("zlib", "hex", "rot13", "utf-16"):
        _error(
            _post_raw(api, "runs/", body, f"application/json; charset={charset}"),
            415,
            "unsupported_media_type",
        )
    assert _post_raw(api, "runs/", body, "application/json; charset=utf-8").status_code == 201
    # Durations past any calendar.
    for value in (1e18, "inf", "99999999999d", 9999999999999):
        _error(api.post("runs/", {"workflow": "tests.echo", "execution_timeout": value}), 400, "invalid")
        _error(api.post("runs/", {"workflow": "tests.echo", "start_delay": value}), 400, "invalid")
    assert _snapshot()[0] == before[0] + 1


def test_a_content_length_that_is_not_a_number_is_not_a_500(api: Api) -> None:
    from django.test import Client

    from .conftest import WEFT_PERMISSIONS, make_user

    user = make_user("lengthy", staff=True, permissions=WEFT_PERMISSIONS)
    browser = Client()
    browser.force_login(user)
    response = browser.post(
        "/api/weft/runs/",
        b'{"workflow": "tests.echo"}',
        content_type="application/json",
        CONTENT_LENGTH="\u00b2",
    )
    assert response.status_code < 500


def test_tampered_cursors_and_search_lookups_are_client_errors(api: Api) -> None:
    client.start("tests.echo", search_attributes={"x": 1})
    tampered = base64.b64encode(b"p=garbage").decode()
    _error(api.get(f"runs/?cursor={tampered}"), 404, "not_found")
    for name in ("x__regex", "x__in", "x\n", "1x"):
        _error(api.get("runs/", params={f"search.{name}": "1"}), 400, "invalid")
    for name in ("isnull", "contains", "has_key"):  # keys, not lookups
        assert api.get("runs/", params={f"search.{name}": "1"}).json()["results"] == []
    for value in ("1e999", "NaN", "-Infinity"):
        response = api.get("runs/", params={"search.x": value})
        assert response.status_code == 200 and response.json()["results"] == [], value
    _error(api.get("runs/", params={"search.x": "a\x00b"}), 400, "invalid")
    assert len(api.get("runs/", params={"search.x": "1"}).json()["results"]) == 1
