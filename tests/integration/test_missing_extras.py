"""A project without one of django-weft's extras gets a message naming the extra to
install, not a bare ``ModuleNotFoundError`` (docs/reference/checks.md, "Missing extras").

Each case runs ``manage.py check`` (or an import) in a child process whose import system
cannot find the extra's packages: a meta path finder, installed before anything else is
imported, answers ``ModuleNotFoundError`` for them, as Python does when they are not
installed. django_weft's own code runs unchanged.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.database_independent]

# The child's entry point: hide the packages named in WEFT_HIDDEN_PACKAGES, then run
# manage.py with the given arguments (or, with "-c CODE", that code after django.setup()).
ENTRY = """
import os, sys

HIDDEN = set(filter(None, os.environ["WEFT_HIDDEN_PACKAGES"].split(",")))


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
if sys.argv[1] == "-c":
    import django

    django.setup()
    exec(sys.argv[2])
else:
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *sys.argv[1:]])
"""

SETTINGS = """
SECRET_KEY = "missing-extras"
USE_TZ = True
INSTALLED_APPS = {apps!r}
ROOT_URLCONF = "project_urls"
DATABASES = {databases!r}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
{more}
"""

URLS = """
from django.urls import include, path

urlpatterns = [path("api/weft/", include("django_weft.api.urls"))]
"""

SQLITE = {
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": ":memory:",
    "OPTIONS": {"transaction_mode": "IMMEDIATE"},
}
BASE_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_weft"]
API_APPS = ["rest_framework", "drf_spectacular", "drf_spectacular_sidecar"]


def run_project(
    tmp_path: Path,
    *args: str,
    hidden: list[str],
    apps: list[str],
    databases: dict[str, object] | None = None,
    more: str = "",
) -> subprocess.CompletedProcess[str]:
    settings = SETTINGS.format(apps=apps, databases=databases or {"default": SQLITE}, more=more)
    (tmp_path / "project_settings.py").write_text(settings)
    (tmp_path / "project_urls.py").write_text(URLS)
    (tmp_path / "entry.py").write_text(ENTRY)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "WEFT_"))}
    env.update(
        PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}",
        DJANGO_SETTINGS_MODULE="project_settings",
        WEFT_HIDDEN_PACKAGES=",".join(hidden),
    )
    return subprocess.run(
        [sys.executable, str(tmp_path / "entry.py"), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def last_line(output: str) -> str:
    return output.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "hidden",
    [
        ["drf_spectacular", "drf_spectacular_sidecar"],
        ["rest_framework", "django_filters", "drf_spectacular", "drf_spectacular_sidecar"],
        ["django_filters"],
    ],
    ids=["without-drf-spectacular", "without-any-of-it", "without-django-filter"],
)
def test_mounting_the_api_without_the_api_extra_names_the_extra(tmp_path: Path, hidden: list[str]) -> None:
    done = run_project(tmp_path, "check", hidden=hidden, apps=BASE_APPS)
    assert done.returncode != 0
    error = last_line(done.stderr)
    assert error.startswith(
        "django.core.exceptions.ImproperlyConfigured: django_weft.api needs the 'api' extra"
    )
    assert hidden[0] in error and 'Install it with: pip install "django-weft[api]"' in error


def test_importing_the_api_urls_without_the_api_extra_names_the_extra(tmp_path: Path) -> None:
    done = run_project(
        tmp_path, "-c", "import django_weft.api.urls", hidden=["drf_spectacular"], apps=BASE_APPS
    )
    assert done.returncode != 0
    assert last_line(done.stderr) == (
        "django.core.exceptions.ImproperlyConfigured: django_weft.api needs the 'api' extra, and "
        "drf_spectacular cannot be imported (No module named 'drf_spectacular'). "
        'Install it with: pip install "django-weft[api]"'
    )


def test_the_same_project_with_the_api_extra_passes_the_checks(tmp_path: Path) -> None:
    """The control: nothing hidden, the apps in place, the same child process is content."""
    done = run_project(tmp_path, "check", hidden=[], apps=[*BASE_APPS, *API_APPS])
    assert done.returncode == 0, done.stderr
    assert "System check identified no issues" in done.stdout


def test_the_celery_app_without_the_celery_extra_names_the_extra(tmp_path: Path) -> None:
    apps = [*BASE_APPS, *API_APPS, "django_weft.contrib.celery"]
    done = run_project(tmp_path, "check", hidden=["celery"], apps=apps)
    assert done.returncode != 0
    assert last_line(done.stderr) == (
        "django.core.exceptions.ImproperlyConfigured: django_weft.contrib.celery needs the 'celery' "
        "extra, and celery cannot be imported (No module named 'celery'). "
        'Install it with: pip install "django-weft[celery]"'
    )
    assert run_project(tmp_path, "check", hidden=[], apps=apps).returncode == 0


POSTGRES = {"ENGINE": "django.db.backends.postgresql", "NAME": "nowhere", "HOST": "127.0.0.1", "PORT": "1"}


def test_a_postgresql_database_without_psycopg_is_a_check_error_naming_the_postgres_extra(
    tmp_path: Path,
) -> None:
    """django_weft's tables on a PostgreSQL alias of their own, psycopg not installed:
    ``check`` names the extra. (When the *default* database is PostgreSQL, Django itself
    stops first, while loading the models: "Error loading psycopg2 or psycopg module".)"""
    apps = [*BASE_APPS, *API_APPS]
    databases = {"default": SQLITE, "workflows": POSTGRES}
    more = 'WEFT_DATABASE_ALIAS = "workflows"'
    done = run_project(
        tmp_path, "check", hidden=["psycopg", "psycopg2"], apps=apps, databases=databases, more=more
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert (
        "(django_weft.E023) Database 'workflows' is PostgreSQL, and psycopg 3 cannot be imported "
        "(No module named 'psycopg'). Django says: Error loading psycopg2 or psycopg module"
    ) in done.stderr
    assert "HINT: Install the 'postgres' extra: pip install \"django-weft[postgres]\"" in done.stderr
    # With psycopg, the same settings pass (the check does not connect).
    done = run_project(tmp_path, "check", hidden=[], apps=apps, databases=databases, more=more)
    assert done.returncode == 0, done.stderr


# A project without the otel extra, tracing off: a run starts, is worked and completes
# in the same process (SQLite in memory, a workflow declared inline).
RUN_UNTRACED = """
from django.core.management import call_command
from django_weft import activity, client, workflow
from django_weft.testing.helpers import drive

call_command("migrate", verbosity=0)


@activity(name="untraced.double")
def double(value):
    return value * 2


@workflow(name="untraced.flow")
def flow(ctx, value):
    return ctx.run(double, value)


handle = client.start("untraced.flow", args=[21])
print(drive(handle.run_id), handle.result(timeout=5))
"""


def test_without_the_otel_extra_runs_start_and_complete_untraced(tmp_path: Path) -> None:
    done = run_project(tmp_path, "-c", RUN_UNTRACED, hidden=["opentelemetry"], apps=BASE_APPS)
    assert done.returncode == 0, done.stderr
    assert last_line(done.stdout) == "completed 42"


def test_tracing_on_without_the_otel_extra_is_a_check_error_naming_the_extra(tmp_path: Path) -> None:
    more, apps = "WEFT_TRACING = True", [*BASE_APPS, *API_APPS]
    done = run_project(tmp_path, "check", hidden=["opentelemetry"], apps=apps, more=more)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert (
        "(django_weft.E029) WEFT_TRACING is on, and the OpenTelemetry API cannot be imported "
        "(No module named 'opentelemetry')."
    ) in done.stderr
    assert "HINT: Install the 'otel' extra: pip install \"django-weft[otel]\"" in done.stderr
    done = run_project(tmp_path, "check", hidden=[], apps=apps, more=more)
    assert done.returncode == 0, done.stderr


def test_metrics_turned_on_without_prometheus_client_is_a_check_error_naming_the_extra(
    tmp_path: Path,
) -> None:
    done = run_project(
        tmp_path, "check", hidden=["prometheus_client"], apps=BASE_APPS, more="WEFT_METRICS = True"
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert "(django_weft.E027) WEFT_METRICS is on, and prometheus_client cannot be imported" in done.stderr
    assert "HINT: Install the 'prometheus' extra: pip install \"django-weft[prometheus]\"" in done.stderr
    done = run_project(tmp_path, "check", hidden=[], apps=[*BASE_APPS, *API_APPS], more="WEFT_METRICS = True")
    assert done.returncode == 0, done.stderr


RUN_WITHOUT_PROMETHEUS = """
from django.core.management import call_command
from django_weft import activity, client, metrics, workflow
from django_weft.engine import observe
from django_weft.testing import drive

call_command("migrate", verbosity=0)


@activity(name="plain.double")
def double(value):
    return 2 * value


@workflow(name="plain.twice")
def twice(ctx, value):
    return ctx.run(double, ctx.run(double, value))


handle = client.start("plain.twice", args=[3])
assert drive(handle.run_id) == "completed"
assert observe.observers() == () and not metrics.enabled()
try:
    import django_weft.metrics.urls
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
print("result", handle.result(timeout=1))
"""


def test_without_prometheus_client_runs_work_and_the_metrics_urls_name_the_extra(tmp_path: Path) -> None:
    done = run_project(tmp_path, "-c", RUN_WITHOUT_PROMETHEUS, hidden=["prometheus_client"], apps=BASE_APPS)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "result 12"
    assert lines[-2] == (
        "ImproperlyConfigured: django_weft.metrics needs the 'prometheus' extra, and prometheus_client "
        "cannot be imported (No module named 'prometheus_client'). "
        'Install it with: pip install "django-weft[prometheus]"'
    )
