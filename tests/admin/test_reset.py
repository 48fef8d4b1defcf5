"""Reset to this step, in the admin: each entry of the steps table links to a confirmation
page with the reason; confirming resets through the runtime; both permissions are needed
on GET and POST (a forged POST is 403 and writes nothing); refusals are form errors; the
run page shows the links between the two runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.urls import reverse

from django_weft import client
from django_weft.models import Signal, Step, Update, WorkflowRun
from django_weft.testing import drive
from tests.support.driver import park
from tests.testapp import workflows
from tests.testapp.models import SideEffect

from .conftest import change_url, logged_in

pytestmark = pytest.mark.django_db(transaction=True)

BOTH = ("view_workflowrun", "cancel_workflowrun", "add_workflowrun")


@pytest.fixture(autouse=True)
def _step_6_broken() -> Iterator[None]:
    workflows.reset_bugs["step_6"] = True
    yield
    workflows.reset_bugs["step_6"] = True


def reset_url(run: WorkflowRun | str) -> str:
    pk = run.pk if isinstance(run, WorkflowRun) else run
    return reverse("admin:django_weft_workflowrun_reset", args=[pk])


def rows() -> tuple[int, ...]:
    return tuple(model.objects.count() for model in (WorkflowRun, Step, Signal, Update, SideEffect))


def failed_run(key: str) -> WorkflowRun:
    handle = client.start("tests.r.ten_steps", args=[key], id=key)
    assert drive(handle.run_id) == "failed"
    return WorkflowRun.objects.get(pk=handle.run_id)


def errors_of(response: Any) -> dict[str, list[str]]:
    assert response.status_code == 200, response.status_code
    form = response.context["adminform"].form
    return {field: [str(message) for message in messages] for field, messages in form.errors.items()}


def test_each_step_links_to_its_reset_page_which_resets_the_run() -> None:
    old = failed_run("admin-fix")
    browser = logged_in("operator", permissions=BOTH)
    page = browser.get(change_url(old)).content.decode()
    for seq in range(7):
        assert f'href="{reset_url(old)}?to_seq={seq}" class="weft-reset-link"' in page
    assert 'class="weft-tool-link weft-tool-reset"' in page

    confirm = browser.get(f"{reset_url(old)}?to_seq=5")
    assert confirm.status_code == 200
    text = confirm.content.decode()
    assert "What a reset does" in text and "keeps its outcome" in text  # a finished run
    assert 'name="to_seq" value="5"' in text
    assert 'data-seq="4"' in text and "kept (replayed)" in text and "runs again" in text
    assert rows() == rows()  # showing the page wrote nothing

    workflows.reset_bugs["step_6"] = False
    done = browser.post(reset_url(old), {"to_seq": "5", "reason": "step 6 fixed", "args": "", "kwargs": ""})
    new = WorkflowRun.objects.exclude(pk=old.pk).get(workflow_id="admin-fix")
    assert done.status_code == 302 and done["Location"] == change_url(new)
    assert new.reset_from["run_id"] == str(old.pk) and new.reset_from["reason"] == "step 6 fixed"
    assert drive(str(new.pk)) == "completed"
    assert [SideEffect.objects.filter(key=f"admin-fix:{i}").count() for i in (0, 4, 5, 9)] == [1, 1, 2, 1]
    logged = {(entry.object_id, entry.action_flag) for entry in LogEntry.objects.all()}
    assert {(str(old.pk), CHANGE), (str(new.pk), ADDITION)} <= logged

    # Both run pages show the link to the other run; the old one offers no reset any more.
    old_page = browser.get(change_url(old)).content.decode()
    assert "<dt>reset to</dt>" in old_page and str(new.pk) in old_page and "weft-reset-link" not in old_page
    new_page = browser.get(change_url(new)).content.decode()
    assert "<dt>reset from</dt>" in new_page and str(old.pk) in new_page and "step 6 fixed" in new_page


def test_refusals_are_errors_on_the_form_and_change_nothing() -> None:
    old = failed_run("admin-bad")
    browser = logged_in("operator", permissions=BOTH)
    before = rows()
    cases: list[tuple[dict[str, str], str, str]] = [
        ({"to_seq": "99", "reason": "x"}, "to_seq", "past the end of the history"),
        ({"to_seq": "-1", "reason": "x"}, "to_seq", "a position is 0 or more"),
        ({"to_seq": "7", "reason": "x"}, "to_seq", "would fail at once"),
        ({"to_seq": "x", "reason": "x"}, "to_seq", "Enter a whole number"),
        ({"to_seq": "3", "reason": ""}, "reason", "This field is required"),
        ({"to_seq": "3", "reason": "x", "args": "{"}, "args", "not valid JSON"),
        ({"to_seq": "3", "reason": "x", "args": '{"a": 1}'}, "args", "Give a JSON list"),
        ({"to_seq": "3", "reason": "x", "args": '["a", "b", "c"]'}, "__all__", "cannot be started with"),
    ]
    for data, field, message in cases:
        errors = errors_of(browser.post(reset_url(old), data))
        assert any(message in text for text in errors.get(field, [])), (data, errors)
    assert rows() == before


def test_a_run_that_is_not_the_latest_says_so_and_offers_no_reset() -> None:
    old = failed_run("admin-latest")
    workflows.reset_bugs["step_6"] = False
    new = client.get_handle(str(old.pk)).reset(5, reason="first")
    browser = logged_in("operator", permissions=BOTH)
    assert "weft-reset-link" not in browser.get(change_url(old)).content.decode()
    page = browser.get(f"{reset_url(old)}?to_seq=5").content.decode()
    assert "is not the latest of workflow id admin-latest" in page and new.run_id in page
    before = rows()
    errors = errors_of(browser.post(reset_url(old), {"to_seq": "5", "reason": "again"}))
    assert "not the latest run of its workflow id" in " ".join(errors["__all__"])
    assert rows() == before


def test_an_open_run_is_closed_by_the_reset() -> None:
    handle = client.start("tests.r.branch", args=["admin-open"], id="admin-open")
    park(handle.run_id)
    browser = logged_in("operator", permissions=BOTH)
    page = browser.get(f"{reset_url(handle.run_id)}?to_seq=1").content.decode()
    assert "is closed: it ends cancelled" in page
    done = browser.post(reset_url(handle.run_id), {"to_seq": "1", "reason": "again"}, follow=True)
    assert done.status_code == 200
    assert any("The old run was closed" in str(message) for message in done.context["messages"])
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "cancelled"


@pytest.mark.parametrize(
    "permissions",
    [
        ("view_workflowrun", "cancel_workflowrun"),
        ("view_workflowrun", "add_workflowrun"),
        ("view_workflowrun", "cancel_workflowrun", "add_workflowrun", "not_staff"),
    ],
    ids=["cancel-only", "add-only", "not-staff"],
)
def test_both_permissions_are_needed_and_a_forged_post_writes_nothing(permissions: tuple[str, ...]) -> None:
    old = failed_run("admin-perm")
    staff = "not_staff" not in permissions
    browser = logged_in("someone", staff=staff, permissions=tuple(p for p in permissions if p != "not_staff"))
    if staff:
        page = browser.get(change_url(old)).content.decode()
        assert "weft-reset-link" not in page and "weft-tool-reset" not in page
    before, epoch = rows(), old.owner_epoch
    assert browser.get(f"{reset_url(old)}?to_seq=5").status_code in (302, 403)
    forged = browser.post(reset_url(old), {"to_seq": "5", "reason": "forged"})
    assert forged.status_code in (302, 403)  # not staff: the admin's login page
    if staff:
        assert forged.status_code == 403
    assert rows() == before
    assert WorkflowRun.objects.get(pk=old.pk).owner_epoch == epoch
    assert WorkflowRun.objects.get(pk=old.pk).reset_to is None
