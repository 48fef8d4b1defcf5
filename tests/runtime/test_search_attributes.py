"""ctx.set_search_attributes on a real database (PostgreSQL and SQLite): merged into the
run's attributes with the step's fenced commit, found at once by ``objects.search``, the
REST ``search.`` filters and the admin search, and not written again on replay."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from django_weft import WorkflowFailed, client
from django_weft.engine.errors import Deposed
from django_weft.engine.records import StepKind, StepStatus, StepWrite
from django_weft.models import Step, WorkflowRun
from django_weft.store import DjangoStore
from django_weft.testing import drive, make_engine
from tests.support.driver import park

pytestmark = pytest.mark.django_db(transaction=True)

SET_AT_START = {"region": "north"}
AFTER_FIRST_TURN = {
    "region": "north",
    "customer": 7,
    "tier": "gold",
    "score": 2.5,
    "vip": True,
    "due": "2030-01-02T03:04:05Z",
    "day": "2030-01-02",
    "stage": "waiting",
}


@pytest.fixture
def staff() -> Client:
    """A superuser's browser: the REST API (session authentication) and the admin."""
    user = get_user_model().objects.create_superuser("root", password="pw")
    browser = Client()
    browser.force_login(user)
    return browser


def waiting_run(key: str) -> str:
    handle = client.start("tests.attrs.lifecycle", args=[key], id=key, search_attributes=SET_AT_START)
    park(handle.run_id)
    return handle.run_id


def attributes(run_id: str) -> dict[str, Any]:
    return WorkflowRun.objects.get(pk=run_id).search_attributes


def rest_ids(browser: Client, **params: str) -> set[str]:
    response = browser.get("/api/weft/runs/", {f"search.{name}": value for name, value in params.items()})
    assert response.status_code == 200, response.content
    return {run["workflow_id"] for run in response.json()["results"]}


def admin_ids(browser: Client, term: str) -> set[str]:
    response = browser.get(reverse("admin:django_weft_workflowrun_changelist"), {"q": term})
    assert response.status_code == 200
    html = response.content.decode()
    return set(re.findall(r'<th class="field-workflow_id"><a href="[^"]*">([^<]*)</a>', html))


def test_typed_values_merge_into_the_start_attributes_and_none_removes() -> None:
    run_id = waiting_run("merge")
    stored = attributes(run_id)
    assert stored == AFTER_FIRST_TURN
    assert type(stored["customer"]) is int and stored["vip"] is True and type(stored["score"]) is float
    steps = Step.objects.filter(run_id=run_id).order_by("seq")
    kinds = list(steps.values_list("seq", "kind", "name", "args"))
    assert kinds[0] == (
        0,
        "search_attrs",
        "customer,day,due,score,temp,tier,vip",
        {"customer": 7, "tier": "gold", "score": 2.5, "vip": True, "due": "2030-01-02T03:04:05Z",
         "day": "2030-01-02", "temp": "merge"},
    )  # fmt: skip
    assert kinds[2] == (2, "search_attrs", "stage,temp", {"temp": None, "stage": "waiting"})


def test_the_values_are_found_at_once_by_the_client_rest_and_admin(staff: Client, on_postgres: bool) -> None:
    waiting_run("found")
    client.start("tests.echo", id="other", search_attributes={"customer": "7", "tier": "basic"})
    runs = WorkflowRun.objects
    typed = {"customer": 7, "vip": True, "score": 2.5, "tier": "gold", "due": "2030-01-02T03:04:05Z",
             "day": "2030-01-02", "stage": "waiting"}  # fmt: skip
    for name, value in typed.items():
        assert list(runs.search(**{name: value}).values_list("workflow_id", flat=True)) == ["found"], name
    assert not runs.search(temp="found").exists()  # removed again
    assert not runs.search(customer="7", tier="gold").exists() and not runs.search(customer=8).exists()
    if on_postgres:  # SQLite's key-by-key comparison also takes the text "true" for true
        assert not runs.search(vip="true").exists()

    # The REST filter and the admin search try a value both as typed text and as JSON.
    assert rest_ids(staff, customer="7") == {"found", "other"}
    assert rest_ids(staff, customer="7", stage="waiting") == {"found"}
    assert rest_ids(staff, vip="true") == rest_ids(staff, score="2.5") == {"found"}
    assert rest_ids(staff, due="2030-01-02T03:04:05Z", day="2030-01-02") == {"found"}
    assert rest_ids(staff, temp="found") == set() and rest_ids(staff, region="north") == {"found"}
    assert admin_ids(staff, "customer=7") == {"found", "other"}
    assert admin_ids(staff, "customer=7 stage=waiting vip=true") == {"found"}
    assert admin_ids(staff, "due=2030-01-02T03:04:05Z score=2.5") == {"found"}
    assert admin_ids(staff, "temp=found") == set()


def test_the_run_is_found_by_another_connection_as_soon_as_the_call_returns() -> None:
    handle = client.start("tests.attrs.seen", args=["seen-1"])
    assert drive(handle.run_id) == "completed"
    assert handle.result() is True  # asked in the same turn, right after the call


def test_replay_does_not_write_the_recorded_attributes_again(staff: Client) -> None:
    run_id = waiting_run("replay")
    recorded = dict(Step.objects.filter(run_id=run_id, kind="search_attrs").values_list("seq", "updated_at"))
    assert sorted(recorded) == [0, 2]

    handle = client.get_handle(run_id)
    handle.signal("finish", {"by": "ann"})
    assert drive(run_id) == "completed" and handle.result() == {"by": "ann"}
    assert attributes(run_id) == {**AFTER_FIRST_TURN, "stage": "done"}
    steps = Step.objects.filter(run_id=run_id, kind="search_attrs")
    assert dict(steps.filter(seq__in=[0, 2]).values_list("seq", "updated_at")) == recorded  # not rewritten
    history = [(entry["kind"], entry["name"]) for entry in handle.history()]
    assert history.count(("search_attrs", "customer,day,due,score,temp,tier,vip")) == 1
    assert history.count(("search_attrs", "stage,temp")) == 1
    assert history.count(("search_attrs", "stage")) == 1
    rest = staff.get(f"/api/weft/runs/{run_id}/history/").json()["results"]
    assert [entry["seq"] for entry in rest if entry["kind"] == "search_attrs"] == [0, 2, 4]
    assert rest_ids(staff, stage="done") == {"replay"}


def test_the_admin_run_page_shows_the_step_on_the_timeline_and_the_attributes(staff: Client) -> None:
    run_id = waiting_run("page")
    page = staff.get(reverse("admin:django_weft_workflowrun_change", args=[run_id])).content.decode()
    (step,) = re.findall(r'<g class="([^"]*)" data-seq="2"', page)
    assert "weft-kind-search_attrs" in step and "#2 search_attrs stage,temp" in page
    assert "&quot;stage&quot;: &quot;waiting&quot;" in page  # the run's search attributes, pretty-printed


@pytest.mark.parametrize(
    ("given", "error_type", "message"),
    [
        ({"tags": ["a", "b"]}, "InvalidInput", "a list is not a search attribute value"),
        ({"weft_schedule_id": "x"}, "InvalidInput", "is reserved"),
        ({"a__b": 1}, "InvalidInput", "is not allowed"),
        ({"big": 2**64}, "InvalidInput", "64-bit"),
        ([["customer", 7]], "InvalidInput", "takes a dict"),
    ],
    ids=["list", "reserved", "double underscore", "huge int", "not a dict"],
)
def test_invalid_attributes_fail_the_run_like_any_workflow_error(
    given: Any, error_type: str, message: str
) -> None:
    handle = client.start("tests.attrs.set", args=[given], search_attributes=SET_AT_START)
    assert drive(handle.run_id) == "failed"
    with pytest.raises(WorkflowFailed) as info:
        handle.result()
    assert info.value.error_type.endswith(error_type) and message in info.value.error_message
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.failure_category == "application" and run.search_attributes == SET_AT_START
    assert not Step.objects.filter(run_id=handle.run_id).exists()


def test_continue_as_new_carries_the_attributes_set_from_code() -> None:
    handle = client.start("tests.attrs.chain", args=[0], id="attrs-chain")
    engine = make_engine()
    engine.run_turn(handle.run_id)
    successor = client.get_handle("attrs-chain")
    assert successor.run_id != handle.run_id
    assert attributes(successor.run_id) == {"customer": 7}
    assert drive(successor.run_id) == "completed"


# -- the store's fenced write ------------------------------------------------------------------


def attribute_step(seq: int) -> StepWrite:
    moment = datetime.now(UTC)
    return StepWrite(seq, StepKind.SEARCH_ATTRIBUTES, "stage", StepStatus.COMPLETED,
                     '{"stage":"x"}', None, None, 1, moment, moment)  # fmt: skip


def test_the_store_merges_with_the_step_and_keeps_untouched_keys_as_they_are() -> None:
    store = DjangoStore()
    run_id = client.start("tests.sleepy", search_attributes={"kept": None, "n": 1, "gone": "x"}).run_id
    claimed = store.turns.claim(run_id, "me", ttl=30, grace=0)
    assert claimed is not None
    store.turns.set_search_attributes(run_id, "me", claimed.epoch, attribute_step(0),
                                {"n": 2, "gone": None, "absent": None, "stage": "x"})  # fmt: skip
    assert attributes(run_id) == {"kept": None, "n": 2, "stage": "x"}
    assert Step.objects.get(run_id=run_id, seq=0).kind == "search_attrs"


def test_a_deposed_owners_attribute_write_is_rejected_and_writes_nothing() -> None:
    store = DjangoStore()
    run_id = client.start("tests.sleepy", search_attributes=SET_AT_START).run_id
    claimed = store.turns.claim(run_id, "old", ttl=30, grace=0)
    assert claimed is not None
    # An external transition (cancel, suspend) or a takeover rotates the epoch.
    WorkflowRun.objects.filter(pk=run_id).update(owner_epoch=claimed.epoch + 1)
    with pytest.raises(Deposed):
        store.turns.set_search_attributes(run_id, "old", claimed.epoch, attribute_step(0), {"stage": "late"})
    assert attributes(run_id) == SET_AT_START
    assert not Step.objects.filter(run_id=run_id).exists()


def test_a_cancelled_run_keeps_its_attributes_and_stays_searchable() -> None:
    run_id = waiting_run("cancelled")
    client.get_handle(run_id).cancel(reason="test")
    assert list(WorkflowRun.objects.search(stage="waiting").values_list("status", flat=True)) == ["cancelled"]
