"""The OpenAPI schema: complete, valid, and honoured by every route under generated input.

schemathesis generates requests for every operation from the schema and calls the app
(WSGI, in-process, on the test database): no response may be a 500, and every response
must match the schema (status code, content type, body).
"""

from __future__ import annotations

import base64
import itertools
import re
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml
from django.core.management import call_command
from django.db import connection
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from django_weft import client
from django_weft.api.exceptions import _DRF_CODES, _WEFT_ERRORS, UNAVAILABLE
from django_weft.models import Schedule
from django_weft.runtime import process_bulk_jobs, start_bulk_job, sync_schedules
from django_weft.runtime.run_sources import RUNS_LIST as RUNS_FROM

from .conftest import PASSWORD, WEFT_PERMISSIONS, Api, make_user

EXAMPLES = {"postgresql": 16, "sqlite": 12}
"""Examples per operation and mode: fewer on SQLite, where the API's code is the same and
the database's own refusals (NUL, lone surrogates, sizes) show within a few examples.
Each field's odd values are walked one by one in tests/api/test_bad_input_walk.py; this
test looks for what combinations of generated values find."""
DECLARED = "tests-nightly-report"  # declared in code by tests.scheduled_report
AUTH = {"Authorization": "Basic " + base64.b64encode(f"fuzz:{PASSWORD}".encode()).decode()}


def test_spectacular_validates_the_schema_without_warnings() -> None:
    out = StringIO()
    call_command("spectacular", "--validate", "--fail-on-warn", "--urlconf", "tests.urls", stdout=out)
    schema = out.getvalue()
    for route in (
        "runs/",
        "runs/{ref}/history/",
        "runs/{ref}/updates/{update_id}/",
        "workflows/",
        "schedules/",
        "schedules/{id}/backfill/",
    ):
        assert f"/api/weft/{route}:" in schema


@pytest.mark.django_db(transaction=True)
def test_the_schema_and_its_pages_are_served_from_local_files(api: Api) -> None:
    schema = api.get("schema/?format=json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/weft/runs/{ref}/signal/" in paths and not any("schema" in path for path in paths)
    error = schema.json()["components"]["schemas"]["Error"]
    assert error["properties"]["error"]["$ref"].endswith("/ErrorBody")
    for page in ("schema/swagger/", "schema/redoc/"):
        html = api.get(page, headers={"Accept": "text/html"})
        assert html.status_code == 200, html.text[:300]
        assert "http://" not in html.text.replace(api.base.split("/api/")[0], "")
        assert "https://" not in html.text, f"{page} loads something from another host"
        assert "/static/drf_spectacular_sidecar/" in html.text
    assert api.as_user(None).get("schema/").status_code == 401


@pytest.mark.fuzz
# 27 operations, valid and invalid input, up to 50 examples each: about two minutes per
# database on a busy two-core machine, over the suite's default timeout.
@pytest.mark.timeout(400)
@pytest.mark.django_db(transaction=True)
def test_no_operation_answers_500_or_breaks_its_schema(live_server: Any) -> None:
    make_user("fuzz", staff=True, permissions=WEFT_PERMISSIONS)
    client.start("tests.m.cart", args=["fuzz"], id="fuzz-cart")
    sync_schedules()  # a schedule declared in code
    job = start_bulk_job("cancel", {"workflow_id": ["no-such-run"]}, user="fuzz", runs_from=RUNS_FROM)
    process_bulk_jobs()
    schema = schemathesis.openapi.from_url(f"{live_server.url}/api/weft/schema/?format=json", headers=AUTH)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 27  # every route and method of the REST table
    calls = 0
    for operation, mode in itertools.product(operations, schemathesis.GenerationMode):

        @given(case=operation.as_strategy(mode))
        @settings(
            max_examples=EXAMPLES.get(connection.vendor, 20),
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def call(case: Any) -> None:
            nonlocal calls
            calls += 1
            # Long polls would make each example wait: generated waits become 0 s.
            if case.query and "wait" in case.query:
                case.query["wait"] = 0
            if isinstance(case.body, dict) and "wait" in case.body:
                case.body["wait"] = 0
            # Every third run reference is one no run can have (a NUL, a control
            # character, 10,000 characters, an emoji), and every fifth write
            # carries an odd Idempotency-Key: a client error each, never a 500.
            if case.path_parameters and "ref" in case.path_parameters and calls % 3 == 0:
                case.path_parameters["ref"] = ODD_REFERENCES[calls % len(ODD_REFERENCES)]
            if case.method.upper() == "POST" and calls % 5 == 0:
                case.headers = {**(case.headers or {}), "Idempotency-Key": ODD_KEYS[calls % len(ODD_KEYS)]}
            # Every other call to a schedule's route names one that exists (generated ids
            # almost never do): one made by hand, or the one declared in code.
            if case.path_parameters and "id" in case.path_parameters and calls % 2:
                case.path_parameters["id"] = _fuzzed_schedule(calls)
            # Likewise for a bulk job's progress: every other call names the one made above.
            if case.path_parameters and "job_id" in case.path_parameters and calls % 2:
                case.path_parameters["job_id"] = job.id
            case.call_and_validate(
                base_url=live_server.url,
                headers=AUTH,
                checks=[
                    checks.not_a_server_error,
                    checks.status_code_conformance,
                    checks.content_type_conformance,
                    checks.response_schema_conformance,
                ],
            )

        call()
    # Both valid and invalid input, for every operation (hypothesis may stop early when
    # an operation has few distinct inputs).
    assert calls >= len(operations) * 2 * 10, calls
    print(f"{calls} generated requests, none answered 500 or broke the schema")


ODD_REFERENCES = ("a\x00b", "\x00", "a\x01b", "x" * 10_000, "\U0001f600", "fuzz-cart\x00")
ODD_KEYS = ("\xe9t\xe9", "x" * 300, "a b", "\x7f", "key-\xff")


def _fuzzed_schedule(calls: int) -> str:
    """The id of an existing schedule (created again when a fuzzed call deleted it)."""
    if calls % 4 == 3:
        if not Schedule.objects.filter(pk=DECLARED).exists():
            sync_schedules()
        return DECLARED
    if not Schedule.objects.filter(pk="fuzz-schedule").exists():
        client.create_schedule("fuzz-schedule", "tests.echo", cron="0 9 * * *", timezone="Europe/Oslo")
    return "fuzz-schedule"


def test_the_rest_reference_lists_every_route_and_error_code_of_the_schema() -> None:
    out = StringIO()
    call_command("spectacular", "--urlconf", "tests.urls", stdout=out)
    schema = yaml.safe_load(out.getvalue())
    in_schema = {
        (method.upper(), path.removeprefix("/api/weft/"))
        for path, operations in schema["paths"].items()
        for method in operations
    }
    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "rest.md").read_text()
    in_docs = set(re.findall(r"^\| (GET|POST|PATCH|DELETE) \| `([^`]+)` \|", page, re.MULTILINE))
    assert in_docs == in_schema
    codes = {code for _, _, code in _WEFT_ERRORS} | set(_DRF_CODES.values()) | {UNAVAILABLE}
    documented = set(re.findall(r"`([a-z_]+)`", page.split("## Errors", 1)[1].split("## Permissions")[0]))
    assert codes <= documented, codes - documented
