from __future__ import annotations

from io import StringIO

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from django_weft.engine.records import StepKind
from django_weft.models import Step


@pytest.mark.django_db
def test_models_match_migrations() -> None:
    out = StringIO()
    call_command("makemigrations", "django_weft", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_every_engine_step_kind_is_a_choice_that_fits_the_column() -> None:
    field = Step._meta.get_field("kind")
    assert {kind.value for kind in StepKind} == {value for value, _ in Step.Kind.choices}
    assert all(len(kind.value) <= field.max_length for kind in StepKind)  # type: ignore[operator]


def ids(**settings: object) -> set[str]:
    with override_settings(**settings):
        return {message.id for message in run_checks() if message.id and message.id.startswith("django_weft")}


@pytest.mark.django_db
def test_default_test_settings_pass_the_checks() -> None:
    assert ids() == set()


@pytest.mark.parametrize(
    ("settings", "check_id"),
    [
        ({"WEFT_LEASE_TTL": 10, "WEFT_LEASE_RENEW_INTERVAL": 5}, "django_weft.E007"),
        ({"WEFT_LEASE_TTL": "forever"}, "django_weft.E001"),
        ({"WEFT_TICK_INTERVAL": 0}, "django_weft.E003"),
        ({"WEFT_TICK_BATCH": 0}, "django_weft.E008"),
        ({"WEFT_MAX_PAYLOAD_BYTES": "big"}, "django_weft.E009"),
        ({"WEFT_RETENTION": "a while"}, "django_weft.E010"),
        ({"WEFT_RETENTION": {"running": "1d"}}, "django_weft.E010"),
        ({"WEFT_RETENTION": {"failed": "a while"}}, "django_weft.E010"),
        ({"WEFT_RETENTION": ["30d"]}, "django_weft.E010"),
        ({"WEFT_DEFAULT_RETRY_POLICY": {"max_attempts": 0}}, "django_weft.E011"),
        ({"WEFT_DISPATCHER": "nowhere.Dispatcher"}, "django_weft.E012"),
        ({"WEFT_DATABASE_ALIAS": "other"}, "django_weft.E013"),
        ({"WEFT_READ_DATABASE": "other"}, "django_weft.E030"),
        ({"WEFT_READ_DATABASE": ["replica"]}, "django_weft.E030"),
        ({"WEFT_AUTODISCOVER_MODULE": "my-workflows"}, "django_weft.E015"),
        ({"WEFT_API_PERMISSION_CLASSES": "rest_framework.permissions.IsAdminUser"}, "django_weft.E016"),
        ({"WEFT_API_PERMISSION_CLASSES": ["myproject.permissions.Nope"]}, "django_weft.E016"),
        ({"WEFT_API_RUN_FILTER": "myproject.tenants.nowhere"}, "django_weft.E018"),
        ({"WEFT_API_RUN_FILTER": 7}, "django_weft.E018"),
        ({"WEFT_API_MAX_WAIT": "forever"}, "django_weft.E019"),
        ({"WEFT_API_MAX_WAIT": -1}, "django_weft.E019"),
        ({"WEFT_API_MAX_BODY_BYTES": 0}, "django_weft.E020"),
        ({"WEFT_RATE_LIMITS": {"tests.paced": "50 per second"}}, "django_weft.E024"),
        ({"WEFT_RATE_LIMITS": {"tests.paced": "0/s"}}, "django_weft.E024"),
        ({"WEFT_RATE_LIMITS": {"tests.paced": 50}}, "django_weft.E024"),
        ({"WEFT_RATE_LIMITS": [("tests.paced", "50/s")]}, "django_weft.E024"),
        ({"WEFT_RATE_LIMITS": {"tests.pased": "50/s"}}, "django_weft.W002"),
    ],
)
@pytest.mark.django_db
def test_bad_settings_are_reported(settings: dict[str, object], check_id: str) -> None:
    assert check_id in ids(**settings)


@pytest.mark.django_db
def test_a_bad_retention_says_what_to_fix() -> None:
    with override_settings(WEFT_RETENTION={"completed": "7d", "waiting": "1d"}):
        (error,) = [message for message in run_checks() if message.id == "django_weft.E010"]
    assert error.msg == (
        "WEFT_RETENTION is invalid: WEFT_RETENTION has the key 'waiting', which is not a terminal "
        "status (only finished runs are deleted); use completed, failed, cancelled, timed_out, "
        "continued or 'default'"
    )
    assert error.hint == "See docs/reference/settings.md#weft_retention"


@pytest.mark.django_db
def test_rate_limits_in_the_documented_forms_pass_and_a_bad_one_says_what_to_write() -> None:
    assert (
        ids(WEFT_RATE_LIMITS={"tests.paced": "50/s", "tests.twenty": "10/5s", "tests.per_account": "600/m"})
        == set()
    )
    with override_settings(WEFT_RATE_LIMITS={"tests.paced": "50/s", "tests.twenty": "50 per second"}):
        (error,) = [message for message in run_checks() if message.id == "django_weft.E024"]
    assert error.msg == (
        "WEFT_RATE_LIMITS is invalid: WEFT_RATE_LIMITS['tests.twenty'] is '50 per second'; write "
        "'<limit>/<period>', for example '50/s', '600/m' or '10/5s'."
    )
    assert error.hint.endswith("See docs/reference/settings.md#weft_rate_limits")
    with override_settings(WEFT_RATE_LIMITS={"stripe": "50/s"}):
        (warning,) = [message for message in run_checks() if message.id == "django_weft.W002"]
    assert "names the rate limit 'stripe', which no registered activity uses" in warning.msg
    assert "tests.paced" in warning.hint


@pytest.mark.django_db(transaction=True)
def test_search_filters_by_contained_attributes_and_uses_the_partial_gin_on_postgres() -> None:
    from django_weft import client
    from django_weft.models import WorkflowRun

    tagged = client.start("tests.echo", search_attributes={"customer": 7, "tier": "gold"})
    client.start("tests.echo", search_attributes={"customer": 8})
    client.start("tests.echo")
    found = WorkflowRun.objects.search(customer=7)
    assert [str(run.pk) for run in found] == [tagged.run_id]
    assert WorkflowRun.objects.search().count() == 3
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'weft_run_search_attrs_gin'")
            (definition,) = cursor.fetchone()
        assert "WHERE (search_attributes <> '{}'::jsonb)" in definition
