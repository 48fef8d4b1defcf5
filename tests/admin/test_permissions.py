"""Who sees the run screens, and that nothing can be added, changed or deleted through them."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_weft.models import WorkflowRun

from .conftest import change_url, changelist_url, logged_in, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def run() -> WorkflowRun:
    return make_run("order-1", status="waiting", waiting_on={"kind": "signal", "seq": 0, "name": "go"})


def test_staff_without_view_permission_gets_403(run: WorkflowRun) -> None:
    staff = logged_in("clerk")
    assert staff.get(changelist_url()).status_code == 403
    assert staff.get(change_url(run)).status_code == 403
    index = staff.get(reverse("admin:index")).content.decode()
    assert "workflowrun" not in index


def test_not_staff_is_sent_to_the_login_page(run: WorkflowRun) -> None:
    outsider = logged_in("visitor", staff=False, permissions=("view_workflowrun",))
    response = outsider.get(changelist_url())
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_view_permission_shows_the_screens_read_only(run: WorkflowRun) -> None:
    viewer = logged_in("viewer", permissions=("view_workflowrun",))
    assert viewer.get(changelist_url()).status_code == 200
    response = viewer.get(change_url(run))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="_save"' not in html and 'name="_continue"' not in html
    assert "signal go" in html


@pytest.mark.parametrize("who", ["viewer", "superuser"])
def test_nothing_is_added_changed_or_deleted(run: WorkflowRun, who: str) -> None:
    if who == "superuser":
        user = logged_in("root", superuser=True)
    else:
        user = logged_in(
            "viewer", permissions=("view_workflowrun", "change_workflowrun", "delete_workflowrun")
        )
    add_url = reverse("admin:django_weft_workflowrun_add")
    assert user.get(add_url).status_code == 403
    assert user.post(add_url, {"workflow_id": "new", "workflow_name": "tests.echo"}).status_code == 403
    assert user.post(change_url(run), {"workflow_id": "changed", "status": "completed"}).status_code == 403
    delete_url = reverse("admin:django_weft_workflowrun_delete", args=[run.pk])
    assert user.get(delete_url).status_code == 403
    assert user.post(delete_url, {"post": "yes"}).status_code == 403
    # A forged bulk delete from the changelist: there are no actions to run.
    response = user.post(changelist_url(), {"action": "delete_selected", "_selected_action": [str(run.pk)]})
    assert response.status_code in (200, 302, 403)
    run.refresh_from_db()
    assert (run.workflow_id, run.status) == ("order-1", "waiting")
    assert WorkflowRun.objects.count() == 1
