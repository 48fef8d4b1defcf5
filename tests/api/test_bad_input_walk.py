"""Every operation of the OpenAPI schema, walked field by field: each query parameter, header
and top-level body field in turn carries each value of a table of odd input (NUL and other
control characters, a lone surrogate, 10,000 characters, an emoji, numbers past 64 bits and
negative ones, a float, booleans, null, a list, an object, SQL and JSON-path metacharacters).

The operations come from the schema the API serves, so a new route, parameter or field is
walked without editing this test. The path parameters name objects that exist, so each
request reaches the field's validation rather than a 404. Every answer is below 500, a
refusal is in the error envelope, and a refusal writes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
from drf_spectacular.generators import SchemaGenerator

from django_weft import client
from django_weft.models import BulkJob, Schedule, Signal, Update, WorkflowRun
from django_weft.runtime import process_bulk_jobs, start_bulk_job
from django_weft.runtime.run_sources import RUNS_LIST
from tests.support.odd_input import ODD_NUMBERS, ODD_TEXT

from .conftest import Api

ODD: dict[str, Any] = {
    **ODD_TEXT,
    **ODD_NUMBERS,
    "huge-float": 1e308,
    "true": True,
    "null": None,
    "list": ["a", 1],
    "object": {"a": {"b": 1}},
    "json-path": '$.a[*] ? (@ == "x") || $.**',
}
"""The odd values; query parameters and headers carry each as text."""

RUN = "walk-run"
SCHEDULE = "walk-schedule"


def _operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    components = schema["components"]["schemas"]
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
            ref = body.get("schema", {}).get("$ref", "")
            fields = list(components[ref.rsplit("/", 1)[-1]].get("properties", {})) if ref else []
            parameters = [(p["in"], p["name"]) for p in operation.get("parameters", []) if p["in"] != "path"]
            walked = {"path": path, "fields": fields, "parameters": parameters}
            yield f"{method.upper()} {path}", method, walked


OPERATIONS = sorted(_operations())


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else requests.compat.json.dumps(value)


def _targets(job_id: str) -> dict[str, str]:
    """Objects the path parameters name, made again when a walked call removed or ended them."""
    if not WorkflowRun.objects.filter(workflow_id=RUN, status__in=("pending", "waiting", "running")).exists():
        WorkflowRun.objects.filter(workflow_id=RUN).delete()
        client.start("tests.sleepy", kwargs={"seconds": 3600}, id=RUN)
    if not Schedule.objects.filter(pk=SCHEDULE).exists():
        client.create_schedule(SCHEDULE, "tests.echo", cron="0 9 * * *", timezone="Europe/Oslo")
    return {"ref": RUN, "id": SCHEDULE, "job_id": job_id, "update_id": "walk-update"}


def _written() -> tuple[int, ...]:
    return (
        WorkflowRun.objects.count(),
        Signal.objects.count(),
        Update.objects.count(),
        Schedule.objects.count(),
        BulkJob.objects.count(),
    )


def _requests(operation: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(what is odd, the keyword arguments of one request) for each field and odd value."""
    for name, value in ODD.items():
        for where, parameter in operation["parameters"]:
            text = _as_text(value)
            if where == "query":
                key = "search.walk" if parameter == "search.<attr>" else parameter
                # Sent as its UTF-8 bytes, a lone surrogate included, percent-encoded.
                yield f"{where} {parameter}={name}", {"params": {key: text.encode("utf-8", "surrogatepass")}}
            # A header is bytes on the wire; HTTP has no NUL, newline or surrogate in one.
            elif where == "header" and not any(ch in "\x00\r\n" or 0xD800 <= ord(ch) < 0xE000 for ch in text):
                yield f"header {parameter}={name}", {"headers": {parameter: text.encode()}}
        for field in operation["fields"]:
            yield f"body {field}={name}", {"json": {field: value}}
        if operation["fields"]:
            yield f"body={name}", {"json": value}


def test_the_walk_covers_every_operation_and_its_fields() -> None:
    names = {name for name, _, _ in OPERATIONS}
    assert len(names) == 27, sorted(names)
    fields = sum(len(op["fields"]) + len(op["parameters"]) for _, _, op in OPERATIONS)
    assert fields >= 60, fields


@pytest.mark.parametrize(("name", "method", "operation"), OPERATIONS, ids=[name for name, _, _ in OPERATIONS])
def test_no_field_of_any_operation_answers_500_to_odd_input(
    api: Api, settings: Any, name: str, method: str, operation: dict[str, Any]
) -> None:
    # A wait the API accepts is capped to this, so a long poll does not hold each call.
    settings.WEFT_API_MAX_WAIT = 0.01
    job = start_bulk_job("cancel", {"workflow_id": ["no-such-run"]}, user="ops", runs_from=RUNS_LIST)
    process_bulk_jobs()
    calls = 0
    for odd, kwargs in _requests(operation):
        path = operation["path"].removeprefix("/api/weft/").format(**_targets(str(job.id)))
        before = _written()
        response = requests.request(method, api.url(path), auth=api.auth, timeout=60, **kwargs)
        calls += 1
        assert response.status_code < 500, (name, odd, response.status_code, response.text[:300])
        if response.status_code >= 400:
            assert "error" in response.json(), (name, odd, response.text[:300])
            assert _written() == before, (name, odd, "a refused request wrote rows")
    # Every field of the operation, with every odd value: a walk that shrank would show here.
    expected_fields = len(operation["fields"]) + len(operation["parameters"])
    assert calls >= len(ODD) * expected_fields * 0.8, calls
