"""The object tools with Django's test client: Send signal, Send update, Run query on a
run's page and Start workflow on the list. Real runs, moved by real turns: a signal sent
from the admin completes a run, an update's result comes from its handler. Every bad
input is an error on the form (never a 500) and stores nothing; each tool is behind its
permission on GET and POST, and its link is shown only to users who have it; what was
sent or started is in the admin log."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.db import connection
from django.test import Client
from django.urls import reverse

from django_weft import client
from django_weft.admin.runs.forms import SignalForm, UpdateForm
from django_weft.engine.executor import TurnOutcome
from django_weft.models import Signal, Update, WorkflowRun
from django_weft.testing import make_engine
from tests.support.driver import Driver, park

from .conftest import change_url, changelist_url, logged_in, make_run

pytestmark = pytest.mark.django_db(transaction=True)

TOOLS = ("signal", "update", "query")


@pytest.fixture
def driver() -> Iterator[Driver]:
    """A worker thread running the runs' turns (an update's result needs one while the
    admin's request waits for it)."""
    worker = Driver("admin-tools-driver")
    yield worker
    worker.stop()


def tool_url(run: WorkflowRun | str, tool: str) -> str:
    pk = run.pk if isinstance(run, WorkflowRun) else run
    return reverse(f"admin:django_weft_workflowrun_{tool}", args=[pk])


def start_url() -> str:
    return reverse("admin:django_weft_workflowrun_start")


def errors_of(response: Any) -> dict[str, list[str]]:
    assert response.status_code == 200, response.status_code
    form = response.context["adminform"].form
    return {field: [str(message) for message in messages] for field, messages in form.errors.items()}


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def logged(run_id: str) -> list[tuple[int, str]]:
    entries = LogEntry.objects.filter(object_id=str(run_id)).order_by("pk")
    return [(entry.action_flag, entry.change_message) for entry in entries]


def parked(workflow: str, *args: Any, id: str) -> WorkflowRun:
    """A run started and parked at its first wait: by this thread, or by a test's
    ``driver`` thread when that claims it first."""
    handle = client.start(workflow, args=list(args), id=id)
    deadline = time.monotonic() + 20
    while WorkflowRun.objects.get(pk=handle.run_id).status != "waiting":
        assert time.monotonic() < deadline, "the run did not park"
        make_engine().run_turn(handle.run_id)  # returns at once when the driver holds it
        time.sleep(0.01)
    return WorkflowRun.objects.get(pk=handle.run_id)


# -- Send signal ------------------------------------------------------------------------------


def test_send_signal_moves_a_waiting_run_to_completion(admin_client_: Client) -> None:
    run = parked("tests.m.wait_with_timeout", 3600, id="tools-signal-1")
    page = admin_client_.get(tool_url(run, "signal"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "Send signal" in html and 'list="weft-known-names"' in html and '<option value="go">' in html
    assert "waits for or handles: go" in html

    response = admin_client_.post(
        tool_url(run, "signal"), {"name": "go", "payload": '{"by": "ann"}', "signal_id": "go-1"}, follow=True
    )
    assert response.redirect_chain == [(change_url(run), 302)]
    assert any("Signal go (signal id go-1) sent" in message for message in messages_of(response))
    signal = Signal.objects.get(run=run)
    assert (signal.name, signal.payload, signal.signal_id) == ("go", {"by": "ann"}, "go-1")
    assert logged(run.pk) == [(CHANGE, "Sent signal go (signal id go-1).")]

    assert make_engine("tools").run_turn(str(run.pk)) == TurnOutcome.COMPLETED
    run.refresh_from_db()
    assert (run.status, run.result) == ("completed", "got {'by': 'ann'}")


def test_a_repeated_signal_id_stores_nothing_new(admin_client_: Client) -> None:
    run = parked("tests.m.wait_with_timeout", 3600, id="tools-signal-2")
    data = {"name": "go", "payload": "1", "signal_id": "once"}
    admin_client_.post(tool_url(run, "signal"), data)
    response = admin_client_.post(tool_url(run, "signal"), data, follow=True)
    assert any("had been accepted already" in message for message in messages_of(response))
    assert Signal.objects.filter(run=run).count() == 1
    assert len(logged(run.pk)) == 1


def test_a_signal_the_run_does_not_wait_for_is_kept_with_a_warning(admin_client_: Client) -> None:
    run = parked("tests.m.wait_with_timeout", 3600, id="tools-signal-3")
    response = admin_client_.post(tool_url(run, "signal"), {"name": "approve", "payload": ""}, follow=True)
    assert any("does not wait for signal approve" in message for message in messages_of(response))
    signal = Signal.objects.get(run=run)
    assert (signal.name, signal.payload, signal.consumed_seq) == ("approve", None, None)


@pytest.mark.parametrize(
    ("data", "field", "expected"),
    [
        ({"name": "go", "payload": "{not json"}, "payload", "not valid JSON"),
        ({"name": "go", "payload": "NaN"}, "payload", "not valid JSON"),
        ({"name": "go", "payload": '"a\\u0000b"'}, "payload", "NUL character"),
        ({"name": "go", "payload": '"a\x00b"'}, "payload", "NUL character"),
        ({"name": "go\x00", "payload": "1"}, "name", "Null characters are not allowed"),
        ({"name": "go\tgo", "payload": "1"}, "name", "control characters"),
        ({"name": "", "payload": "1"}, "name", "required"),
        ({"name": "n" * 201, "payload": "1"}, "name", "at most 200 characters"),
        ({"name": "go", "payload": "[" * 100_000}, "payload", "nested too deeply"),
        ({"name": "go", "payload": "1", "signal_id": "a\nb"}, "signal_id", "control characters"),
    ],
)
def test_bad_signal_input_is_a_form_error_and_stores_nothing(
    admin_client_: Client, data: dict[str, str], field: str, expected: str
) -> None:
    run = parked("tests.m.wait_with_timeout", 3600, id="tools-signal-bad")
    errors = errors_of(admin_client_.post(tool_url(run, "signal"), data))
    assert any(expected in message for message in errors[field]), errors
    assert not Signal.objects.filter(run=run).exists()
    assert logged(run.pk) == []


def test_a_payload_over_the_limit_is_a_form_error(admin_client_: Client, settings: Any) -> None:
    settings.WEFT_MAX_PAYLOAD_BYTES = 1000
    run = parked("tests.m.wait_with_timeout", 3600, id="tools-signal-big")
    errors = errors_of(
        admin_client_.post(tool_url(run, "signal"), {"name": "go", "payload": f'"{"x" * 2000}"'})
    )
    assert any("over the limit of 1000 bytes" in message for message in errors["payload"]), errors
    assert not Signal.objects.filter(run=run).exists()


def test_a_body_over_djangos_upload_limit_is_a_client_error(admin_client_: Client) -> None:
    run = parked("tests.m.wait_with_timeout", 3600, id="tools-signal-huge")
    response = admin_client_.post(tool_url(run, "signal"), {"name": "go", "payload": f'"{"x" * 3_000_000}"'})
    assert response.status_code == 400
    assert not Signal.objects.filter(run=run).exists()


def test_a_run_that_finished_meanwhile_takes_no_signal(admin_client_: Client) -> None:
    run = parked("tests.m.wait_with_timeout", 3600, id="tools-signal-late")
    assert admin_client_.get(tool_url(run, "signal")).status_code == 200  # the form, while it waits
    client.get_handle(str(run.pk)).signal("go", "elsewhere")
    assert make_engine("tools").run_turn(str(run.pk)) == TurnOutcome.COMPLETED

    errors = errors_of(admin_client_.post(tool_url(run, "signal"), {"name": "go", "payload": "1"}))
    assert any("is completed: a finished run takes no signal" in message for message in errors["__all__"])
    assert Signal.objects.filter(run=run).count() == 1  # the one sent before it finished
    assert logged(run.pk) == []


def test_a_run_that_finished_meanwhile_takes_no_update(admin_client_: Client) -> None:
    run = parked("tests.m.cart", "tools-late", id="tools-update-late")
    assert admin_client_.get(tool_url(run, "update")).status_code == 200
    client.get_handle(str(run.pk)).cancel(reason="elsewhere")

    data = {"name": "close", "payload": "", "wait": "1"}
    errors = errors_of(admin_client_.post(tool_url(run, "update"), data))
    assert any("is cancelled: a finished run takes no update" in message for message in errors["__all__"])
    assert not Update.objects.filter(run=run).exists()
    assert logged(run.pk) == []


def test_a_run_whose_workflow_is_no_longer_registered_is_a_form_error(admin_client_: Client) -> None:
    run = make_run(
        "tools-gone",
        status="waiting",
        workflow="tests.removed",
        waiting_on={"kind": "signal", "seq": 0, "name": "go", "signals": ["go"], "updates": ["fix"]},
    )
    for tool, data in (("update", {"name": "fix", "wait": "0"}), ("query", {"name": "state"})):
        (message,) = errors_of(admin_client_.post(tool_url(run, tool), data))["__all__"]
        assert "No workflow is registered under the name 'tests.removed'" in message
    assert not Update.objects.exists()


def test_a_finished_run_explains_that_it_takes_no_signals_or_updates(admin_client_: Client) -> None:
    run = make_run("tools-done", status="completed")
    for tool, what in (("signal", "signals"), ("update", "updates")):
        response = admin_client_.get(tool_url(run, tool))
        assert response.status_code == 200
        html = response.content.decode()
        assert f"This run has finished (completed): a finished run takes no {what}" in html
        assert "<form" not in html.split('id="content-main"')[1]
    page = admin_client_.get(change_url(run)).content.decode()
    assert "weft-tool-signal" not in page and "weft-tool-update" not in page
    assert "weft-tool-query" in page


def test_an_unknown_run_is_a_404(admin_client_: Client) -> None:
    for tool in TOOLS:
        assert admin_client_.get(tool_url("00000000-0000-0000-0000-000000000000", tool)).status_code == 404
        assert admin_client_.post(tool_url("not-a-run-id", tool), {"name": "go"}).status_code == 404


# -- Send update ------------------------------------------------------------------------------


def test_send_update_shows_the_handlers_result(admin_client_: Client, driver: Driver) -> None:
    run = parked("tests.m.cart", "tools-u1", id="tools-update-1")
    page = admin_client_.get(tool_url(run, "update")).content.decode()
    for name in ("address", "broken", "close", "nap"):
        assert f'<option value="{name}">' in page
    response = admin_client_.post(
        tool_url(run, "update"),
        {"name": "address", "payload": '{"city": "Oslo"}', "update_id": "addr-1", "wait": "10"},
    )
    assert response.status_code == 200
    outcome = response.context["weft_outcome"]
    assert outcome.title == "Result" and not outcome.failed
    html = response.content.decode()
    assert "Update address (update id addr-1) was applied" in html
    assert "&quot;city&quot;: &quot;Oslo&quot;" in html and "&quot;items&quot;: 0" in html
    assert Update.objects.get(run=run, update_id="addr-1").status == "completed"
    assert logged(run.pk) == [(CHANGE, "Sent update address (update id addr-1).")]
    # The same update id again: the stored outcome, nothing applied twice, no second log entry.
    again = admin_client_.post(
        tool_url(run, "update"), {"name": "address", "payload": '{"city": "Oslo"}', "update_id": "addr-1"}
    )
    assert again.context["weft_outcome"].title == "Result"
    assert Update.objects.filter(run=run).count() == 1 and len(logged(run.pk)) == 1


def test_a_validator_rejection_is_a_form_error_and_stores_nothing(admin_client_: Client) -> None:
    run = parked("tests.m.cart", "tools-u2", id="tools-update-2")
    response = admin_client_.post(
        tool_url(run, "update"), {"name": "address", "payload": '{"street": "Main"}'}
    )
    assert errors_of(response) == {"payload": ["city is required"]}
    assert not Update.objects.filter(run=run).exists()
    assert logged(run.pk) == []


def test_an_unknown_update_lists_the_handlers(admin_client_: Client) -> None:
    run = parked("tests.m.cart", "tools-u3", id="tools-update-3")
    response = admin_client_.post(tool_url(run, "update"), {"name": "rename", "payload": "1"})
    (message,) = errors_of(response)["name"]
    assert "no update handler 'rename'" in message and "address, broken, close, nap" in message
    assert not Update.objects.filter(run=run).exists()


def test_an_update_not_answered_in_time_says_it_was_accepted(admin_client_: Client) -> None:
    run = parked("tests.m.cart", "tools-u4", id="tools-update-4")
    response = admin_client_.post(
        tool_url(run, "update"), {"name": "close", "payload": "", "update_id": "close-1", "wait": "0"}
    )
    outcome = response.context["weft_outcome"]
    assert outcome.title == "Accepted, no result yet"
    assert "Update close (update id close-1) is accepted and stored" in outcome.summary
    assert Update.objects.get(run=run, update_id="close-1").status == "accepted"
    assert logged(run.pk) == [(CHANGE, "Sent update close (update id close-1).")]
    # The run applies it at its next turn.
    assert make_engine("tools").run_turn(str(run.pk)) == TurnOutcome.COMPLETED


def test_a_failing_handler_is_shown_with_its_error(admin_client_: Client, driver: Driver) -> None:
    run = parked("tests.m.cart", "tools-u5", id="tools-update-5")
    response = admin_client_.post(tool_url(run, "update"), {"name": "broken", "payload": ""})
    outcome = response.context["weft_outcome"]
    assert outcome.failed and outcome.title == "The handler failed"
    assert "ZeroDivisionError: division by zero" in outcome.summary
    assert "Traceback" in response.content.decode()
    assert len(logged(run.pk)) == 1


@pytest.mark.parametrize("wait", ["31", "-1", "nan", "inf", "soon"])
def test_the_wait_is_bounded(admin_client_: Client, wait: str) -> None:
    run = parked("tests.m.cart", "tools-u6", id="tools-update-6")
    errors = errors_of(admin_client_.post(tool_url(run, "update"), {"name": "close", "wait": wait}))
    assert list(errors) == ["wait"]
    assert not Update.objects.filter(run=run).exists()


def test_update_bad_json_and_nul_are_form_errors(admin_client_: Client) -> None:
    run = parked("tests.m.cart", "tools-u7", id="tools-update-7")
    for payload in ('{"city": ', '{"city": "O\\u0000slo"}'):
        errors = errors_of(
            admin_client_.post(tool_url(run, "update"), {"name": "address", "payload": payload})
        )
        assert list(errors) == ["payload"]
    assert not Update.objects.filter(run=run).exists()


def test_an_update_completes_with_atomic_requests_on(
    admin_client_: Client, driver: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Wrapped in the request's transaction, the update would not be visible to the worker
    # until the view returned: it would always time out.
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    run = parked("tests.m.cart", "tools-u8", id="tools-update-8")
    response = admin_client_.post(tool_url(run, "update"), {"name": "close", "payload": "", "wait": "10"})
    assert response.context["weft_outcome"].title == "Result"


# -- Run query --------------------------------------------------------------------------------


def test_run_query_shows_the_result_and_writes_nothing(admin_client_: Client) -> None:
    run = parked("tests.m.cart", "tools-q1", id="tools-query-1")
    client.get_handle(str(run.pk)).signal("add", "apple")
    assert make_engine("tools").run_turn(str(run.pk)) == TurnOutcome.PARKED
    response = admin_client_.post(tool_url(run, "query"), {"name": "count", "args": "[2]"})
    assert response.context["weft_outcome"].title == "Result"
    assert "Query count answered:" in response.content.decode()
    assert re.search(r'<pre class="weft-json">3</pre>', response.content.decode())
    response = admin_client_.post(tool_url(run, "query"), {"name": "state"})
    assert "&quot;apple&quot;" in response.content.decode()
    assert logged(run.pk) == []


def test_an_unknown_query_lists_the_handlers(admin_client_: Client) -> None:
    run = parked("tests.m.cart", "tools-q2", id="tools-query-2")
    response = admin_client_.post(tool_url(run, "query"), {"name": "total"})
    (message,) = errors_of(response)["name"]
    assert "no query handler 'total'" in message and "count, state" in message
    html = response.content.decode()
    assert '<option value="count">' in html and '<option value="state">' in html


@pytest.mark.parametrize(
    ("args", "expected"),
    [("{}", "Give a JSON list"), ("[1,", "not valid JSON"), ('["\\u0000"]', "NUL character")],
)
def test_bad_query_args_are_form_errors(admin_client_: Client, args: str, expected: str) -> None:
    run = parked("tests.m.cart", "tools-q3", id="tools-query-3")
    errors = errors_of(admin_client_.post(tool_url(run, "query"), {"name": "count", "args": args}))
    assert any(expected in message for message in errors["args"]), errors


def test_a_query_that_raises_is_shown_as_failed(admin_client_: Client) -> None:
    run = parked("tests.m.cart", "tools-q4", id="tools-query-4")
    response = admin_client_.post(tool_url(run, "query"), {"name": "count", "args": "[1, 2, 3]"})
    outcome = response.context["weft_outcome"]
    assert outcome.failed and "TypeError" in outcome.summary


def test_a_finished_run_answers_queries(admin_client_: Client) -> None:
    handle = client.start("tests.m.collect", args=["item", 1], id="tools-query-5")
    park(handle.run_id)
    handle.signal("item", "last")
    assert make_engine("tools").run_turn(handle.run_id) == TurnOutcome.COMPLETED
    response = admin_client_.post(tool_url(handle.run_id, "query"), {"name": "received"})
    assert response.context["weft_outcome"].title == "Result"
    assert "&quot;last&quot;" in response.content.decode()


# -- Start workflow ---------------------------------------------------------------------------


def test_start_workflow_starts_a_run_and_shows_it(admin_client_: Client) -> None:
    page = admin_client_.get(start_url()).content.decode()
    assert '<option value="tests.m.cart">tests.m.cart(key: str)</option>' in page
    response = admin_client_.post(
        start_url(),
        {
            "workflow": "tests.m.cart",
            "args": '["k-1"]',
            "workflow_id": "tools-start-1",
            "on_conflict": "fail",
            "search_attributes": '{"customer": 7}',
        },
        follow=True,
    )
    run = WorkflowRun.objects.get(workflow_id="tools-start-1")
    assert response.redirect_chain == [(change_url(run), 302)]
    assert any(f"Started tests.m.cart tools-start-1: run {run.pk}" in m for m in messages_of(response))
    assert (run.workflow_name, run.args, run.kwargs, run.search_attributes) == (
        "tests.m.cart",
        ["k-1"],
        {},
        {"customer": 7},
    )
    assert logged(run.pk) == [(ADDITION, "Started workflow tests.m.cart (workflow id tools-start-1).")]
    park(str(run.pk))  # a real run: its worker takes it from here


def test_start_with_a_delay_and_a_timeout(admin_client_: Client) -> None:
    admin_client_.post(
        start_url(),
        {
            "workflow": "tests.echo",
            "kwargs": '{"a": 1}',
            "workflow_id": "tools-start-2",
            "on_conflict": "fail",
            "start_delay": "1h",
            "execution_timeout": "7d",
        },
    )
    run = WorkflowRun.objects.get(workflow_id="tools-start-2")
    assert run.status == "pending" and run.kwargs == {"a": 1} and run.execution_deadline is not None


def test_arguments_that_do_not_fit_the_workflow_are_a_form_error(admin_client_: Client) -> None:
    response = admin_client_.post(
        start_url(), {"workflow": "tests.m.cart", "args": "[]", "on_conflict": "fail"}
    )
    (message,) = errors_of(response)["__all__"]
    assert "missing a required argument: 'key'" in message and "Its parameters after ctx are" in message
    assert not WorkflowRun.objects.exists()


def test_a_taken_workflow_id_is_a_form_error(admin_client_: Client) -> None:
    existing = client.start("tests.echo", id="tools-taken")
    data = {"workflow": "tests.echo", "workflow_id": "tools-taken", "on_conflict": "fail"}
    (message,) = errors_of(admin_client_.post(start_url(), data))["workflow_id"]
    assert "already exists" in message
    assert WorkflowRun.objects.filter(workflow_id="tools-taken").count() == 1

    # use_existing shows the run that has the id, and starts nothing.
    response = admin_client_.post(start_url(), {**data, "on_conflict": "use_existing"}, follow=True)
    assert response.redirect_chain == [(change_url(WorkflowRun.objects.get(pk=existing.run_id)), 302)]
    assert any("no new run was started" in message for message in messages_of(response))
    assert WorkflowRun.objects.filter(workflow_id="tools-taken").count() == 1
    assert logged(existing.run_id) == []


@pytest.mark.parametrize(
    ("data", "field", "expected"),
    [
        ({"workflow": "tests.nope"}, "workflow", "Select a valid choice"),
        ({"workflow": ""}, "workflow", "required"),
        ({"args": '{"a": 1}'}, "args", "Give a JSON list"),
        ({"kwargs": "[1]"}, "kwargs", "Give a JSON object"),
        ({"kwargs": '{"a": '}, "kwargs", "not valid JSON"),
        ({"search_attributes": '"customer"'}, "search_attributes", "Give a JSON object"),
        ({"workflow_id": "order\x00-1"}, "workflow_id", "Null characters are not allowed"),
        ({"workflow_id": "order\r-1"}, "workflow_id", "control characters"),
        ({"workflow_id": "x" * 300}, "workflow_id", "at most"),
        ({"start_delay": "soon"}, "start_delay", "not a duration"),
        ({"execution_timeout": "-5"}, "execution_timeout", "must not be negative"),
        ({"on_conflict": "replace"}, "on_conflict", "Select a valid choice"),
        ({"args": '["\\u0000"]'}, "args", "NUL character"),
    ],
)
def test_bad_start_input_is_a_form_error_and_starts_nothing(
    admin_client_: Client, data: dict[str, str], field: str, expected: str
) -> None:
    form = {"workflow": "tests.echo", "on_conflict": "fail", **data}
    errors = errors_of(admin_client_.post(start_url(), form))
    assert any(expected in message for message in errors[field]), errors
    assert not WorkflowRun.objects.exists()
    assert not LogEntry.objects.exists()


def test_start_args_over_the_payload_limit_are_a_form_error(admin_client_: Client, settings: Any) -> None:
    settings.WEFT_MAX_PAYLOAD_BYTES = 100
    form = {"workflow": "tests.echo", "on_conflict": "fail", "args": f'["{"x" * 200}"]'}
    errors = errors_of(admin_client_.post(start_url(), form))
    assert any("over the limit of 100 bytes" in message for message in errors["args"]), errors
    assert not WorkflowRun.objects.exists()


# -- permissions and links --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "permission"),
    [
        ("signal", "signal_workflowrun"),
        ("update", "update_workflowrun"),
        ("query", "view_workflowrun"),
        ("start", "add_workflowrun"),
    ],
)
def test_each_tool_needs_its_permission_on_get_and_post(tool: str, permission: str) -> None:
    run = parked("tests.m.cart", "tools-p", id="tools-perm")
    url = start_url() if tool == "start" else tool_url(run, tool)
    data = {"name": "close", "workflow": "tests.echo", "on_conflict": "fail", "wait": "0"}
    others = tuple(sorted({"view_workflowrun", "change_workflowrun", "delete_workflowrun"} - {permission}))
    without = logged_in("without", permissions=others)
    assert without.get(url).status_code == 403
    assert without.post(url, data).status_code == 403
    assert not Update.objects.exists() and WorkflowRun.objects.count() == 1 and not LogEntry.objects.exists()

    holder = logged_in("holder", permissions=(permission,))
    assert holder.get(url).status_code == 200
    response = holder.post(url, data)
    assert response.status_code in (200, 302)
    if tool == "update":
        assert Update.objects.filter(run=run).count() == 1
    if tool == "start":
        assert WorkflowRun.objects.count() == 2

    outsider = logged_in("outsider", staff=False, permissions=(permission,))
    response = outsider.get(url)
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_links_are_shown_only_with_their_permission() -> None:
    run = parked("tests.m.cart", "tools-l", id="tools-links")
    viewer = logged_in("viewer", permissions=("view_workflowrun",))
    page = viewer.get(change_url(run)).content.decode()
    assert "weft-tool-query" in page
    assert "weft-tool-signal" not in page and "weft-tool-update" not in page
    assert "weft-tool-start" not in viewer.get(changelist_url()).content.decode()

    operator = logged_in(
        "operator",
        permissions=("view_workflowrun", "signal_workflowrun", "update_workflowrun", "add_workflowrun"),
    )
    page = operator.get(change_url(run)).content.decode()
    for tool in TOOLS:
        assert f'href="{tool_url(run, tool)}"' in page
    assert f'href="{start_url()}"' in operator.get(changelist_url()).content.decode()


def test_a_user_who_may_start_but_not_view_is_sent_back_to_the_start_page() -> None:
    starter = logged_in("starter", permissions=("add_workflowrun",))
    response = starter.post(
        start_url(),
        {"workflow": "tests.echo", "workflow_id": "tools-blind", "on_conflict": "fail"},
        follow=True,
    )
    assert response.redirect_chain == [(start_url(), 302)]
    assert any("Started tests.echo tools-blind" in message for message in messages_of(response))
    assert WorkflowRun.objects.filter(workflow_id="tools-blind").exists()


def test_the_payload_boxes_hold_at_most_the_payload_limit(settings: Any) -> None:
    """The browser stops a paste over ``WEFT_MAX_PAYLOAD_BYTES`` (read live), so an
    operator never sends a body larger than Django takes."""
    settings.WEFT_MAX_PAYLOAD_BYTES = 4096
    for form in (SignalForm(), UpdateForm()):
        assert 'maxlength="4096"' in str(form["payload"])
