"""Tasks on the surfaces every run has: the admin's and the REST API's ``kind`` filter,
a schedule that starts a task, the async twins of ``enqueue``/``get_result``, and the
backend's system checks."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core import checks

from django_weft import PayloadError, client
from django_weft.models import WorkflowRun
from django_weft.tasks import WeftTaskBackend
from django_weft.tasks.framework import TaskResultStatus
from tests.admin.conftest import changelist_url
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def test_the_admins_kind_filter_tells_tasks_from_workflows(weft: Any, admin_client_: Any) -> None:
    task_run = tasks.add.enqueue(1, 2)
    workflow_run = client.start("tests.echo", args=["x"])
    tasks_page = admin_client_.get(changelist_url(), {"kind": "task"})
    workflows_page = admin_client_.get(changelist_url(), {"kind": "workflow"})
    assert tasks_page.status_code == workflows_page.status_code == 200
    assert task_run.id in tasks_page.content.decode()
    assert workflow_run.run_id not in tasks_page.content.decode()
    assert workflow_run.run_id in workflows_page.content.decode()
    assert task_run.id not in workflows_page.content.decode()
    assert "By kind" in admin_client_.get(changelist_url()).content.decode()


def test_the_rest_apis_kind_filter_lists_tasks(weft: Any, admin_client_: Any) -> None:
    task_run = tasks.add.enqueue(1, 2)
    client.start("tests.echo", args=["x"])
    found = admin_client_.get("/api/weft/runs/", {"kind": "task"})
    assert found.status_code == 200, found.content
    assert [run["run_id"] for run in found.json()["results"]] == [task_run.id]
    assert found.json()["results"][0]["workflow"] == "tests.testapp.tasks.add"
    refused = admin_client_.get("/api/weft/runs/", {"kind": "chore"})
    assert refused.status_code == 400 and "kind" in str(refused.json()), refused.json()


def test_a_schedule_can_start_a_task(weft: Any) -> None:
    client.create_schedule("add-hourly", "tests.testapp.tasks.add", every="1h", args=[20, 22])
    # To just past its first fire (an hour later would pass two near the top of an hour).
    due = client.get_schedule_handle("add-hourly").describe().next_fire_times[0]
    weft.advance(due - weft.now() + timedelta(seconds=1))
    [run] = WorkflowRun.objects.filter(workflow_name="tests.testapp.tasks.add")
    assert (run.status, run.result) == ("completed", 42)


def test_aenqueue_and_aget_result(weft: Any) -> None:
    result = async_to_sync(tasks.add.aenqueue)(3, 4)
    weft.run_until_idle()
    again = async_to_sync(tasks.add.aget_result)(result.id)
    assert (again.status, again.return_value) == (TaskResultStatus.SUCCESSFUL, 7)


def test_arguments_that_are_not_json_are_refused_with_a_payload_error(weft: Any) -> None:
    with pytest.raises(PayloadError):
        tasks.add.enqueue(object(), 1)


def settings_checks() -> list[Any]:
    """The checks of settings (django_weft's are tagged compatibility). Not the model
    checks, which ask every database alias its features: on SQLite a query, on aliases
    these tests may not use."""
    return list(checks.run_checks(tags=[checks.Tags.compatibility]))


def test_the_checks_report_a_task_backends_bad_options(settings: Any) -> None:
    settings.TASKS = {
        **settings.TASKS,
        "bad": {
            "BACKEND": "django_weft.tasks.WeftTaskBackend",
            "OPTIONS": {"retry": {"max_attempts": 0}, "retries": 3},
        },
    }
    found = {m.id: m for m in settings_checks() if m.id in ("django_weft.E025", "django_weft.E026")}
    assert set(found) == {"django_weft.E025", "django_weft.E026"}
    assert "TASKS['bad']" in found["django_weft.E025"].msg and "'retries'" in found["django_weft.E025"].msg
    assert "max_attempts" in found["django_weft.E026"].msg
    assert WeftTaskBackend("bad", settings.TASKS["bad"]).default_retry is None


def test_the_backends_retry_option_is_its_default_policy() -> None:
    good = WeftTaskBackend("good", {"OPTIONS": {"retry": {"max_attempts": 2}}})
    assert good.default_retry is not None and good.default_retry.max_attempts == 2
    assert not [m for m in settings_checks() if m.id in ("django_weft.E025", "django_weft.E026")]
