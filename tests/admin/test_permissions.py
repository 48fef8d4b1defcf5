"""What the run screens show to whom. Who may open which screen, for every admin URL and
action, is the generated matrix of test_permission_matrix.py."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_weft.models import WorkflowRun

from .conftest import change_url, changelist_url, logged_in, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def run() -> WorkflowRun:
    return make_run("order-1", status="waiting", waiting_on={"kind": "signal", "seq": 0, "name": "go"})


def test_the_index_hides_runs_from_staff_without_view_permission(run: WorkflowRun) -> None:
    index = logged_in("clerk").get(reverse("admin:index")).content.decode()
    assert "workflowrun" not in index
    shown = logged_in("watcher", permissions=("view_workflowrun",)).get(reverse("admin:index"))
    assert "workflowrun" in shown.content.decode()


def test_view_permission_shows_the_screens_read_only(run: WorkflowRun) -> None:
    viewer = logged_in("viewer", permissions=("view_workflowrun",))
    assert viewer.get(changelist_url()).status_code == 200
    response = viewer.get(change_url(run))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="_save"' not in html and 'name="_continue"' not in html
    assert "signal go" in html


def test_a_forged_delete_action_deletes_nothing(run: WorkflowRun) -> None:
    """The list offers no delete action; a POST naming Django's own deletes nothing."""
    user = logged_in("root", superuser=True)
    response = user.post(changelist_url(), {"action": "delete_selected", "_selected_action": [str(run.pk)]})
    assert response.status_code in (200, 302, 403)
    run.refresh_from_db()
    assert (run.workflow_id, run.status) == ("order-1", "waiting")
    assert WorkflowRun.objects.count() == 1
