"""The cancel action's confirmation offers "request cancellation (the workflow can clean
up)" next to "cancel now"."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import LogEntry

from django_weft import client
from django_weft.models import WorkflowRun
from django_weft.testing import drive
from tests.support.driver import park
from tests.testapp.models import SideEffect

from .conftest import change_url, logged_in
from .test_actions import choose, confirm, confirmation_form, messages_of

pytestmark = pytest.mark.django_db(transaction=True)


def saga(key: str) -> str:
    handle = client.start("tests.x.saga", args=[key], id=f"saga-{key}")
    park(handle.run_id)
    return handle.run_id


def test_the_confirmation_offers_both_modes_and_cancel_now_is_the_default() -> None:
    root = logged_in("root", superuser=True)
    run_id = saga("default")
    response = choose(root, "cancel_runs", [run_id])
    form = confirmation_form(response)
    html = response.content.decode()
    assert re.search(r'<input type="radio" name="mode" value="terminate"[^>]* checked', html)
    assert not re.search(r'<input type="radio" name="mode" value="request"[^>]* checked', html)
    assert "Request cancellation (the workflow can clean up)" in html and "Cancel now" in html
    confirm(root, form)  # no mode posted: cancel now
    assert WorkflowRun.objects.get(pk=run_id).status == "cancelled"
    assert SideEffect.objects.filter(key="default:release").count() == 0


def test_request_cancellation_sends_each_run_a_request_the_workflow_cleans_up_after() -> None:
    root = logged_in("root", superuser=True)
    first, second = saga("adm1"), saga("adm2")
    form = confirmation_form(choose(root, "cancel_runs", [first, second]))
    response = confirm(root, form, mode="request", reason="maintenance")
    assert response.status_code == 302
    (message,) = messages_of(response)
    assert message == "Asked to cancel 2 runs."
    for run_id, key in ((first, "adm1"), (second, "adm2")):
        run = WorkflowRun.objects.get(pk=run_id)
        assert run.status == "running" and run.cancel_request["reason"] == "maintenance"
        assert drive(run_id) == "cancelled"
        assert SideEffect.objects.filter(key=f"{key}:release").count() == 1
    entries = LogEntry.objects.filter(object_id__in=[first, second])
    assert sorted(entry.change_message for entry in entries) == ["Asked to cancel (reason: maintenance)"] * 2

    page = root.get(change_url(WorkflowRun.objects.get(pk=first))).content.decode()
    assert "cancellation request" in page and "received at position 2" in page
