"""Tasks of Django's task framework in the admin, in Chromium: the run list's "kind"
filter shows them apart from workflows, and a failed task's page has its error and a
Retry that runs it again."""

from __future__ import annotations

from typing import Any

from django_weft.tasks.framework import TaskResultStatus
from tests.support.waiting import wait_until
from tests.testapp import tasks

from .conftest import Browser, make_user


def test_tasks_are_filtered_by_kind_and_a_failed_one_is_retried_from_its_page(
    browser: Browser, driver: Any
) -> None:
    make_user("root", superuser=True)
    added = tasks.add.enqueue(2, 3)
    failed = tasks.fails_until.enqueue("browser", 4)  # three attempts: fails
    for result in (added, failed):
        done = lambda result=result: result.task.get_backend().get_result(result.id).is_finished  # noqa: E731
        wait_until(done, "the tasks to end")

    browser.login("root")
    browser.go("/admin/django_weft/workflowrun/?kind=task")
    rows = browser.all("#result_list tbody tr")
    assert len(rows) == 2
    assert {"tests.testapp.tasks.add", "tests.testapp.tasks.fails_until"} <= {
        text for row in rows for text in row.text.split()
    }
    browser.screenshot("tasks-changelist")

    browser.go(f"/admin/django_weft/workflowrun/{failed.id}/change/")
    page = browser.find("body").text
    assert "RuntimeError" in page and "attempt 3 of browser fails" in page
    browser.screenshot("task-failed-run")
    browser.find("form.weft-lifecycle button.weft-lifecycle-retry").click()
    browser.find("#weft-action-form input[type=submit]").click()
    browser.find(".messagelist")
    wait_until(
        lambda: tasks.fails_until.get_result(failed.id).status == TaskResultStatus.SUCCESSFUL, "the retry"
    )
    assert tasks.fails_until.get_result(failed.id).return_value == 4
