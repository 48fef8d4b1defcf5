"""The system checks for the apps the REST API's schema pages need (django_weft.E021,
E022): reported when the URL conf mounts the API without them, at any depth, and only then.
The Swagger page of the same settings is opened to show what each check prevents."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.checks import run_checks
from django.test import Client, override_settings
from django.urls import include, path

from django_weft.checks import check_api_apps

# This module is a URL conf too: the test URLs (admin and API) one level down.
urlpatterns = [path("service/", include("tests.urls"))]
NESTED = __name__


def apps_without(*names: str) -> list[str]:
    return [app for app in settings.INSTALLED_APPS if app not in names]


def weft_ids() -> set[str]:
    return {message.id for message in run_checks() if message.id and message.id.startswith("django_weft")}


def test_the_test_settings_mount_the_api_with_its_apps() -> None:
    assert check_api_apps() == []


@pytest.mark.parametrize(
    ("missing", "check_ids"),
    [
        (["drf_spectacular"], {"django_weft.E021"}),
        (["drf_spectacular_sidecar"], {"django_weft.E022"}),
        (["drf_spectacular", "drf_spectacular_sidecar"], {"django_weft.E021", "django_weft.E022"}),
    ],
)
@pytest.mark.parametrize("urlconf", ["tests.urls", NESTED], ids=["mounted", "mounted-one-level-down"])
def test_the_api_mounted_without_an_app_its_pages_need_is_an_error(
    missing: list[str], check_ids: set[str], urlconf: str
) -> None:
    with override_settings(INSTALLED_APPS=apps_without(*missing), ROOT_URLCONF=urlconf):
        errors = check_api_apps()
        assert weft_ids() == check_ids  # registered: manage.py check reports them
    assert {error.id for error in errors} == check_ids
    for error in errors:
        assert "includes 'django_weft.api.urls'" in error.msg
        assert error.hint.startswith('Add "drf_spectacular')


def test_the_swagger_error_names_the_500_it_prevents() -> None:
    with override_settings(INSTALLED_APPS=apps_without("drf_spectacular")):
        (error,) = check_api_apps()
    assert error.msg == (
        "The URL conf includes 'django_weft.api.urls', but 'drf_spectacular' is not in INSTALLED_APPS: "
        "its Swagger UI page answers 500 (TemplateDoesNotExist: drf_spectacular/swagger_ui.html)."
    )
    assert error.hint == 'Add "drf_spectacular" to INSTALLED_APPS (see docs/reference/rest.md).'


@pytest.mark.django_db
def test_what_e021_says_is_what_happens() -> None:
    """Without the app the Swagger page is a 500; with it, a 200."""
    admin = get_user_model().objects.create_superuser("checks-admin", "a@example.com", "pw")
    client = Client(raise_request_exception=False)
    client.force_login(admin)
    assert client.get("/api/weft/schema/swagger/").status_code == 200
    with override_settings(INSTALLED_APPS=apps_without("drf_spectacular")):
        assert client.get("/api/weft/schema/swagger/").status_code == 500


def test_a_project_that_does_not_mount_the_api_needs_none_of_its_apps() -> None:
    apps = apps_without("rest_framework", "django_filters", "drf_spectacular", "drf_spectacular_sidecar")
    with override_settings(INSTALLED_APPS=apps, ROOT_URLCONF="django.contrib.auth.urls"):
        assert check_api_apps() == []
