"""The run admin's lifecycle actions (cancel, suspend, resume, retry): the confirmation
page, the per-run outcome message, the admin history, the permissions, "apply to all runs
matching the filter" and the lifecycle buttons of a run's page. Runs are real: started
through the client and parked or finished by a worker's turns."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from html import unescape
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_weft import client
from django_weft.models import WorkflowRun
from django_weft.runtime.operations import CANCEL_REASON
from django_weft.testing import drive
from tests.support.driver import park

from .conftest import change_url, changelist_url, logged_in

pytestmark = pytest.mark.django_db(transaction=True)

WAITS = "tests.m.wait_with_timeout"
VIEW = ("view_workflowrun",)
CANCEL = ("view_workflowrun", "cancel_workflowrun")
SUSPEND = ("view_workflowrun", "suspend_workflowrun")
ACTION_NAMES = ("cancel_runs", "suspend_runs", "resume_runs", "retry_runs")


def waiting(workflow_id: str, **options: Any) -> str:
    handle = client.start(WAITS, args=[3600], id=workflow_id, **options)
    park(handle.run_id)
    return handle.run_id


def finished(workflow: str, workflow_id: str) -> str:
    handle = client.start(workflow, id=workflow_id)
    drive(handle.run_id)
    return handle.run_id


def status(run_id: str) -> str:
    return WorkflowRun.objects.get(pk=run_id).status


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


class _Form(HTMLParser):
    """The confirmation form: its action URL and the fields a browser would send."""

    def __init__(self) -> None:
        super().__init__()
        self.action: str | None = None
        self.fields: list[tuple[str, str]] = []
        self._inside = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "form" and found.get("id") == "weft-action-form":
            self._inside, self.action = True, found.get("action") or ""
        elif (
            tag == "input" and self._inside and found.get("type") in ("hidden", "text") and found.get("name")
        ):
            self.fields.append((str(found["name"]), found.get("value") or ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._inside = False


def confirmation_form(response: Any) -> _Form:
    assert response.status_code == 200, response
    assert "admin/django_weft/workflowrun/confirm_action.html" in [t.name for t in response.templates]
    form = _Form()
    form.feed(response.content.decode())
    assert form.action is not None, "no confirmation form on the page"
    return form


def confirm(user: Client, form: _Form, **extra: str) -> Any:
    """Press "Yes" on a confirmation page (with ``extra`` fields typed in)."""
    fields = [(name, extra.pop(name, value)) for name, value in form.fields]
    fields += list(extra.items())
    return user.post(form.action or "", urlencode(fields), content_type="application/x-www-form-urlencoded")


def choose(user: Client, action: str, run_ids: list[str], query: str = "", **extra: str) -> Any:
    """Pick ``action`` on the changelist (``query`` its filters) with these rows ticked."""
    data: dict[str, Any] = {"action": action, "index": "0", "_selected_action": run_ids, **extra}
    return user.post(f"{changelist_url()}?{query}" if query else changelist_url(), data)


# -- each action: confirmation, outcome, history -------------------------------------------


def test_the_cancel_confirmation_lists_the_runs_and_changes_nothing_until_confirmed() -> None:
    root = logged_in("root", superuser=True)
    first, second = waiting("act-1"), waiting("act-2")
    done = finished("tests.echo", "act-done")

    response = choose(root, "cancel_runs", [first, second, done])

    form = confirmation_form(response)
    html = response.content.decode()
    assert "Cancel workflow runs?" in html
    assert "the <strong>3 selected runs</strong>?" in html
    for workflow_id in ("act-1", "act-2", "act-done"):
        assert f">{workflow_id}</a>" in html
    assert html.count("will be skipped: already finished (completed)") == 1
    assert sorted(value for name, value in form.fields if name == "_selected_action") == sorted(
        [first, second, done]
    )
    assert ("post", "yes") in form.fields and ("action", "cancel_runs") in form.fields
    assert ("reason", "") in form.fields
    assert 'class="button cancel-link">No, take me back</a>' in html
    assert 'value="Yes, cancel 3 runs"' in html
    assert [status(run_id) for run_id in (first, second, done)] == ["waiting", "waiting", "completed"]
    assert not LogEntry.objects.exists()


def test_confirming_cancel_cancels_reports_each_run_and_writes_the_admin_history() -> None:
    root = logged_in("root", superuser=True)
    first, second = waiting("act-1"), waiting("act-2")
    done = finished("tests.echo", "act-done")
    form = confirmation_form(choose(root, "cancel_runs", [first, second, done]))

    response = confirm(root, form, reason="customer asked")

    assert response.status_code == 302 and response["Location"] == changelist_url()
    assert messages_of(response) == ["Cancelled 2 runs. Skipped 1: already finished (completed): act-done."]
    for run_id in (first, second):
        run = WorkflowRun.objects.get(pk=run_id)
        assert run.status == "cancelled" and run.error["reason"] == "customer asked"
    assert status(done) == "completed"
    entries = LogEntry.objects.order_by("object_id")
    assert sorted(entry.object_id for entry in entries) == sorted([first, second])
    for entry in entries:
        assert entry.action_flag == CHANGE and entry.user.username == "root"
        assert entry.change_message == "Cancelled (reason: customer asked)"
        assert entry.get_change_message() == "Cancelled (reason: customer asked)"
        assert "[cancelled]" in entry.object_repr
    history = root.get(reverse("admin:django_weft_workflowrun_history", args=[first])).content.decode()
    assert "Cancelled (reason: customer asked)" in history


def test_suspend_resume_and_retry_report_what_they_changed_and_skipped() -> None:
    root = logged_in("root", superuser=True)
    parked, other = waiting("srr-1"), waiting("srr-2")
    failed = finished("tests.raises", "srr-failed")

    response = confirm(root, confirmation_form(choose(root, "suspend_runs", [parked, failed])))
    assert messages_of(response) == ["Suspended 1 run. Skipped 1: already finished (failed): srr-failed."]
    assert status(parked) == "suspended"

    response = confirm(root, confirmation_form(choose(root, "resume_runs", [parked, other])))
    assert messages_of(response) == ["Resumed 1 run. Skipped 1: not suspended (waiting): srr-2."]
    assert status(parked) == "running"

    response = confirm(root, confirmation_form(choose(root, "retry_runs", [failed])))
    assert messages_of(response) == ["Retried 1 run."]
    assert status(failed) == "running"

    response = confirm(root, confirmation_form(choose(root, "resume_runs", [other])))
    assert messages_of(response) == ["No run was resumed. Skipped 1: not suspended (waiting): srr-2."]
    assert [entry.change_message for entry in LogEntry.objects.order_by("pk")] == [
        "Suspended",
        "Resumed",
        "Retried",
    ]


@pytest.mark.parametrize(
    ("action", "title", "says"),
    [
        ("cancel_runs", "Cancel workflow runs?", "stops at once and for good"),
        ("suspend_runs", "Suspend workflow runs?", "No worker drives a suspended run"),
        ("resume_runs", "Resume workflow runs?", "becomes runnable"),
        ("retry_runs", "Retry workflow runs?", "attempts its failed step afresh"),
    ],
)
def test_each_action_has_its_confirmation_page(action: str, title: str, says: str) -> None:
    root = logged_in("root", superuser=True)
    run_id = waiting("confirm-1")

    response = choose(root, action, [run_id])

    form = confirmation_form(response)
    html = response.content.decode()
    assert f"<title>{title}" in html and says in html
    assert '<div class="breadcrumbs">' in html and "Workflow runs</a>" in html
    assert ("reason" in dict(form.fields)) == (action == "cancel_runs")
    assert status(run_id) == "waiting"


def test_a_run_that_finished_between_confirmation_and_yes_is_reported_as_skipped() -> None:
    root = logged_in("root", superuser=True)
    run_id = waiting("late-1")
    form = confirmation_form(choose(root, "cancel_runs", [run_id]))
    client.get_handle(run_id).signal("go", "now")
    drive(run_id)
    assert status(run_id) == "completed"

    response = confirm(root, form)

    assert response.status_code == 302
    assert messages_of(response) == ["No run was cancelled. Skipped 1: already finished (completed): late-1."]
    assert not LogEntry.objects.exists()


def test_a_run_removed_meanwhile_is_skipped_as_no_such_run() -> None:
    root = logged_in("root", superuser=True)
    gone = str(uuid.uuid4())

    response = root.post(
        changelist_url(), {"action": "cancel_runs", "_selected_action": [gone], "post": "yes"}
    )

    assert response.status_code == 302
    assert messages_of(response) == [f"No run was cancelled. Skipped 1: no such run: {gone}."]


def test_a_selection_of_runs_that_no_longer_exist_gets_a_message_not_a_page() -> None:
    root = logged_in("root", superuser=True)
    response = choose(root, "cancel_runs", [str(uuid.uuid4())])
    assert response.status_code == 302
    assert messages_of(response) == ["The selected runs no longer exist; nothing was changed."]


# -- bad input: a message, never a 500, nothing changed ------------------------------------


@pytest.mark.parametrize("confirmed", [False, True])
def test_selected_values_that_are_not_run_ids_are_refused_with_a_message(confirmed: bool) -> None:
    root = logged_in("root", superuser=True)
    run_id = waiting("garbage-1")
    data: dict[str, Any] = {"action": "cancel_runs", "_selected_action": [run_id, "order-1", "1 OR 1=1"]}
    if confirmed:
        data["post"] = "yes"
    else:
        data["index"] = "0"

    response = root.post(changelist_url(), data)

    assert response.status_code == 302
    assert messages_of(response) == ["Not a run id: 'order-1', '1 OR 1=1'; nothing was changed."]
    assert status(run_id) == "waiting"


def test_a_reason_too_long_shows_the_confirmation_again_with_the_error() -> None:
    root = logged_in("root", superuser=True)
    run_id = waiting("reason-1")
    form = confirmation_form(choose(root, "cancel_runs", [run_id]))

    response = confirm(root, form, reason="x" * (CANCEL_REASON.max_length + 1))

    confirmation_form(response)
    assert f"Ensure this value has at most {CANCEL_REASON.max_length} characters" in response.content.decode()
    assert status(run_id) == "waiting"


def test_a_bad_time_stamp_on_an_all_matching_confirmation_changes_nothing() -> None:
    root = logged_in("root", superuser=True)
    run_id = waiting("stamp-1")
    query = "status__exact=waiting"
    form = confirmation_form(choose(root, "cancel_runs", [], query, _weft_all_matching="1"))

    response = confirm(root, form, _weft_as_of="yesterday-ish")

    assert response.status_code == 302
    assert messages_of(response) == [
        "The confirmation's time stamp is not valid; nothing was changed. Choose the action again."
    ]
    assert status(run_id) == "waiting"


def test_an_unknown_action_name_is_djangos_no_action_selected() -> None:
    root = logged_in("root", superuser=True)
    run_id = waiting("unknown-1")
    response = choose(root, "drop_table_runs", [run_id])
    assert response.status_code == 302
    assert messages_of(response) == ["No action selected."]
    assert status(run_id) == "waiting"


# -- permissions ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "permissions", "offered"),
    [
        ("superuser", (), ACTION_NAMES),
        ("viewer", VIEW, ()),
        ("canceller", CANCEL, ("cancel_runs", "retry_runs")),
        ("suspender", SUSPEND, ("suspend_runs", "resume_runs")),
    ],
)
def test_each_user_is_offered_the_actions_of_their_permissions(
    who: str, permissions: tuple[str, ...], offered: tuple[str, ...]
) -> None:
    user = logged_in(who, superuser=who == "superuser", permissions=permissions)
    waiting("perm-1")

    html = user.get(changelist_url()).content.decode()

    assert {name for name in ACTION_NAMES if f'<option value="{name}">' in html} == set(offered)
    if offered:
        assert 'class="action-select"' in html and 'name="action"' in html
    else:  # view-only staff: no checkbox column, no action bar at all
        assert 'class="action-select"' not in html and 'name="action"' not in html
        assert 'id="action-toggle"' not in html
    assert "delete_selected" not in html


@pytest.mark.parametrize(
    ("who", "permissions", "action"),
    [
        ("viewer", VIEW, "cancel_runs"),
        ("viewer", VIEW, "suspend_runs"),
        ("canceller", CANCEL, "suspend_runs"),
        ("canceller", CANCEL, "resume_runs"),
        ("suspender", SUSPEND, "cancel_runs"),
        ("suspender", SUSPEND, "retry_runs"),
    ],
)
@pytest.mark.parametrize("step", ["choose", "confirm", "all matching"])
def test_a_forged_post_of_an_action_without_its_permission_is_refused(
    who: str, permissions: tuple[str, ...], action: str, step: str
) -> None:
    user = logged_in(who, permissions=permissions)
    run_id = waiting("forged-1")
    if step == "choose":
        response = choose(user, action, [run_id])
    elif step == "confirm":
        response = user.post(
            changelist_url(), {"action": action, "_selected_action": [run_id], "post": "yes"}
        )
    else:
        response = user.post(
            f"{changelist_url()}?status__exact=waiting",
            {"action": action, "_weft_all_matching": "1", "select_across": "1", "post": "yes"},
        )

    assert response.status_code == 403
    assert status(run_id) == "waiting"
    assert not LogEntry.objects.exists()


def test_a_user_with_the_permission_can_do_what_the_forged_posts_could_not() -> None:
    canceller = logged_in("canceller", permissions=CANCEL)
    run_id = waiting("allowed-1")
    response = canceller.post(
        changelist_url(), {"action": "cancel_runs", "_selected_action": [run_id], "post": "yes"}
    )
    assert messages_of(response) == ["Cancelled 1 run."]
    assert status(run_id) == "cancelled"


# -- apply to all runs matching the filter -------------------------------------------------


def test_all_matching_the_filter_cancels_every_run_across_pages_and_only_those() -> None:
    root = logged_in("root", superuser=True)
    wanted = {waiting(f"bulk-{i:03}") for i in range(120)}
    other = client.start("tests.sleepy", args=[3600], id="other-workflow").run_id
    park(other)
    done = finished("tests.echo", "not-waiting")
    query = f"status__exact=waiting&workflow={WAITS}"

    page = root.get(f"{changelist_url()}?{query}").content.decode()
    assert 'name="_weft_all_matching"' in page
    assert "at least 120" in page or "120 workflow runs" in page
    assert "across all pages" not in page  # Django's own "Select all N" link needs a count

    response = choose(root, "cancel_runs", [], f"{query}&p=2", _weft_all_matching="1")

    form = confirmation_form(response)
    html = response.content.decode()
    assert "all 120 runs</strong> matching" in html
    assert f"status: waiting; workflow: {WAITS}" in html
    assert html.count('<li class="weft-action-run') == 100 and "and 20 more" in html
    assert not any(name == "_selected_action" for name, _ in form.fields)
    assert ("select_across", "1") in form.fields and ("_weft_all_matching", "1") in form.fields
    assert form.action == f"{changelist_url()}?{query}"  # the filter, without the page number
    assert 'value="Yes, cancel all 120 runs"' in html
    assert WorkflowRun.objects.filter(status="waiting").count() == 121

    response = confirm(root, form)

    assert response.status_code == 302 and response["Location"] == f"{changelist_url()}?{query}"
    assert messages_of(response) == ["Cancelled 120 runs."]
    assert set(WorkflowRun.objects.filter(status="cancelled").values_list("pk", flat=True)) == {
        uuid.UUID(run_id) for run_id in wanted
    }
    assert status(other) == "waiting" and status(done) == "completed"
    assert LogEntry.objects.count() == 120


def test_all_matching_a_search_uses_the_same_search_on_confirmation() -> None:
    root = logged_in("root", superuser=True)
    tagged = [waiting(f"tagged-{i}", search_attributes={"batch": "b7"}) for i in range(3)]
    untagged = waiting("untagged", search_attributes={"batch": "b8"})

    form = confirmation_form(choose(root, "suspend_runs", [], "q=batch%3Db7", _weft_all_matching="1"))
    response = confirm(root, form)

    assert messages_of(response) == ["Suspended 3 runs."]
    assert {status(run_id) for run_id in tagged} == {"suspended"}
    assert status(untagged) == "waiting"


def test_the_confirmation_says_every_kind_of_filter_in_words() -> None:
    root = logged_in("root", superuser=True)
    run_id = waiting("words-1", search_attributes={"team": "red"})
    page = root.get(changelist_url()).content.decode()
    link = re.search(r'<a href="\?(created_at__gte=[^"]*)"[^>]*>Past 7 days</a>', page)
    assert link is not None
    query = f"{unescape(link.group(1))}&has_parent=no&workflow_id=words-1&q=team%3Dred"

    response = choose(root, "suspend_runs", [], query, _weft_all_matching="1")

    confirmation_form(response)
    words = "created at: Past 7 days; parent: top-level runs; workflow_id = words-1; search “team=red”"
    assert f'all 1 run</strong> matching <strong class="weft-filter-words">{words}</strong>?' in (
        unescape(response.content.decode())
    )
    assert status(run_id) == "waiting"


def test_all_matching_leaves_runs_created_after_the_confirmation_alone() -> None:
    root = logged_in("root", superuser=True)
    before = waiting("early")
    form = confirmation_form(choose(root, "cancel_runs", [], "status__exact=waiting", _weft_all_matching="1"))
    later = waiting("late")
    WorkflowRun.objects.filter(pk=later).update(created_at=timezone.now() + timedelta(seconds=1))

    response = confirm(root, form)

    assert messages_of(response) == ["Cancelled 1 run."]
    assert (status(before), status(later)) == ("cancelled", "waiting")


def test_all_matching_needs_a_filter_or_a_search() -> None:
    root = logged_in("root", superuser=True)
    run_id = waiting("unfiltered")
    assert 'name="_weft_all_matching"' not in root.get(changelist_url()).content.decode()

    response = choose(root, "cancel_runs", [], _weft_all_matching="1")

    assert response.status_code == 302
    assert messages_of(response) == [
        "“Apply to all matching” needs a filter or a search first; nothing was changed."
    ]
    assert status(run_id) == "waiting"


def test_all_matching_a_filter_that_matches_nothing_says_so() -> None:
    root = logged_in("root", superuser=True)
    waiting("nothing-1")
    response = choose(root, "cancel_runs", [], "status__exact=suspended", _weft_all_matching="1")
    assert response.status_code == 302
    assert messages_of(response) == ["No run matches the current filter; nothing was changed."]


@pytest.mark.parametrize("query", ["status__exact=waiting&no_such_field=1", "created_at__gte=not-a-date"])
def test_all_matching_with_a_broken_filter_is_not_a_server_error(query: str) -> None:
    root = logged_in("root", superuser=True)
    run_id = waiting("broken-1")
    response = choose(root, "cancel_runs", [], query, _weft_all_matching="1")
    assert response.status_code == 302
    assert messages_of(response) == ["The list's filter is not valid; nothing was changed."]
    assert status(run_id) == "waiting"


# -- the lifecycle buttons of a run's page -------------------------------------------------


def buttons(html: str) -> list[str]:
    return [name for name in ACTION_NAMES if f'name="action" value="{name}"' in html]


def test_a_runs_page_shows_the_buttons_its_status_allows() -> None:
    root = logged_in("root", superuser=True)
    parked = waiting("buttons-waiting")
    failed = finished("tests.raises", "buttons-failed")
    done = finished("tests.echo", "buttons-done")
    suspended = waiting("buttons-suspended")
    client.get_handle(suspended).suspend()

    def page(run_id: str) -> str:
        return root.get(change_url(WorkflowRun.objects.get(pk=run_id))).content.decode()

    assert buttons(page(parked)) == ["cancel_runs", "suspend_runs"]
    assert buttons(page(suspended)) == ["cancel_runs", "resume_runs"]
    assert buttons(page(failed)) == ["retry_runs"]
    assert buttons(page(done)) == []
    html = page(parked)
    assert f'name="_selected_action" value="{parked}"' in html
    assert f'action="{changelist_url()}"' in html and "django_weft/actions.css" in html


@pytest.mark.parametrize(
    ("who", "permissions", "shown"),
    [
        ("viewer", VIEW, []),
        ("canceller", CANCEL, ["cancel_runs"]),
        ("suspender", SUSPEND, ["suspend_runs"]),
    ],
)
def test_a_runs_page_shows_only_the_buttons_of_the_users_permissions(
    who: str, permissions: tuple[str, ...], shown: list[str]
) -> None:
    user = logged_in(who, permissions=permissions)
    run_id = waiting("buttons-perm")
    html = user.get(change_url(WorkflowRun.objects.get(pk=run_id))).content.decode()
    assert buttons(html) == shown


def test_a_button_leads_to_the_confirmation_and_back_to_the_runs_page() -> None:
    root = logged_in("root", superuser=True)
    run_id = waiting("button-1")
    run_page = change_url(WorkflowRun.objects.get(pk=run_id))

    response = root.post(
        changelist_url(), {"action": "suspend_runs", "_selected_action": run_id, "_weft_return": run_page}
    )
    form = confirmation_form(response)
    assert ("_weft_return", run_page) in form.fields
    assert f'href="{run_page}" class="button cancel-link"' in response.content.decode()

    response = confirm(root, form)

    assert response.status_code == 302 and response["Location"] == run_page
    assert messages_of(response) == ["Suspended 1 run."]
    assert status(run_id) == "suspended"


def test_a_return_address_on_another_host_is_ignored() -> None:
    root = logged_in("root", superuser=True)
    run_id = waiting("button-2")
    response = root.post(
        changelist_url(),
        {
            "action": "cancel_runs",
            "_selected_action": run_id,
            "post": "yes",
            "_weft_return": "//evil.example/",
        },
    )
    assert response.status_code == 302 and response["Location"] == changelist_url()
    assert status(run_id) == "cancelled"


# -- the outcome message -------------------------------------------------------------------


def test_the_outcome_message_names_ten_runs_per_reason_and_the_failures_as_an_error() -> None:
    from django.contrib import messages

    from django_weft.admin.runs.actions import CANCEL, outcome_message
    from django_weft.runtime import BulkFailure, BulkOutcome, BulkRun

    finished_runs = tuple(BulkRun(str(uuid.uuid4()), f"order-{i}") for i in range(12))
    outcome = BulkOutcome(
        "cancel",
        changed=(BulkRun(str(uuid.uuid4()), "order-a"),),
        skipped={"already finished (completed)": finished_runs},
        failed=(BulkFailure(BulkRun(str(uuid.uuid4()), "order-z"), "IntegrityError: refused\n by a rule"),),
    )

    text, level = outcome_message(CANCEL, outcome)

    named = ", ".join(f"order-{i}" for i in range(10))
    assert text == (
        f"Cancelled 1 run. Skipped 12: already finished (completed): {named} and 2 more. "
        "Failed 1: order-z (IntegrityError: refused by a rule). The django_weft log has the details."
    )
    assert level == messages.ERROR
    assert outcome_message(CANCEL, BulkOutcome("cancel", changed=outcome.changed)) == (
        "Cancelled 1 run.",
        messages.SUCCESS,
    )
