"""``related_runs``: an object's workflow runs on its own admin page, keyed on a workflow
id or a search attribute, newest first and capped, each linking to its run page and the
whole set to the run changelist."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import reverse
from django.utils import timezone

from django_weft.admin import RelatedRuns, related_runs
from django_weft.models import WorkflowRun
from tests.testapp.models import LedgerEntry

from .conftest import change_url, logged_in, make_run
from .related_site import LedgerEntryAdmin, site

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.admin.related_urls")]


def entry_url(entry: LedgerEntry) -> str:
    return reverse("related_admin:testapp_ledgerentry_change", args=[entry.pk])


def run_ids(fragment: str) -> list[str]:
    return re.findall(r'<tr data-run="([^"]+)">', str(fragment))


def links(fragment: str) -> list[str]:
    return [html.unescape(href) for href in re.findall(r'<a href="([^"]*)"', str(fragment))]


def listed(client: Client, url: str) -> set[str]:
    """The run ids in the changelist at ``url``."""
    response = client.get(url)
    assert response.status_code == 200, url
    found = re.findall(
        r'<th class="field-workflow_id"><a href="[^"]*/workflowrun/([^/]+)/change/', response.content.decode()
    )
    return set(found)


@pytest.fixture
def entry() -> LedgerEntry:
    return LedgerEntry.objects.create(key="k1", amount=5)


@pytest.fixture
def entry_runs(entry: LedgerEntry) -> list[WorkflowRun]:
    """Five runs of ``ledger-k1`` (four finished, the newest waiting), newest last."""
    now = timezone.now()
    made = [
        make_run(
            "ledger-k1",
            status="waiting" if index == 4 else "completed",
            workflow="tests.atomic_ledger",
            created_at=now - timedelta(minutes=10 - index),
            search_attributes={"ledger_id": entry.pk},
        )
        for index in range(5)
    ]
    # Not this entry's: another id that starts the same, another entry's attribute.
    make_run("ledger-k10", search_attributes={"ledger_id": entry.pk + 1})
    make_run("ledger-k", search_attributes={"other": entry.pk})
    return made


# -- keyed on the workflow id -----------------------------------------------------------


def test_newest_first_capped_with_a_link_to_all_of_them(
    entry: LedgerEntry, entry_runs: list[WorkflowRun]
) -> None:
    shown = LedgerEntryAdmin.runs_by_id(entry)
    newest = [str(run.pk) for run in reversed(entry_runs)]
    assert run_ids(shown) == newest[:3]
    assert [change_url(run) for run in reversed(entry_runs[2:])] == [
        link for link in links(shown) if "/change/" in link
    ]
    assert "weft-badge-waiting" in shown and shown.count("weft-badge-completed") == 2
    assert "all 5 runs" in shown
    (everything,) = [link for link in links(shown) if "/change/" not in link]
    assert parse_qs(urlsplit(everything).query) == {"q": ["ledger-k1"]}
    viewer = logged_in("viewer", permissions=("view_workflowrun",))
    assert listed(viewer, everything) == {str(run.pk) for run in entry_runs}


def test_a_callable_gives_one_id_or_several(entry: LedgerEntry, entry_runs: list[WorkflowRun]) -> None:
    refund = make_run("refund-k1", workflow="tests.echo")
    one = related_runs(workflow_id=lambda obj: f"ledger-{obj.key}")
    assert set(run_ids(one(entry))) == {str(run.pk) for run in entry_runs}
    both = related_runs(workflow_id=lambda obj: [f"ledger-{obj.key}", f"refund-{obj.key}"], limit=10)
    shown = both(entry)
    assert set(run_ids(shown)) == {str(run.pk) for run in [*entry_runs, refund]}
    (everything,) = [link for link in links(shown) if "/change/" not in link]
    assert parse_qs(urlsplit(everything).query) == {"workflow_id__in": ["ledger-k1,refund-k1"]}
    viewer = logged_in("viewer", permissions=("view_workflowrun",))
    assert listed(viewer, everything) == {str(run.pk) for run in [*entry_runs, refund]}


@pytest.mark.parametrize("workflow_id", ["ledger k1", "ledger=k1"])
def test_an_id_the_search_box_would_misread_links_by_lookup(entry: LedgerEntry, workflow_id: str) -> None:
    run = make_run(workflow_id)
    shown = related_runs(workflow_id=lambda obj: workflow_id)(entry)
    assert run_ids(shown) == [str(run.pk)]
    (everything,) = [link for link in links(shown) if "/change/" not in link]
    assert parse_qs(urlsplit(everything).query) == {"workflow_id": [workflow_id]}
    viewer = logged_in("viewer", permissions=("view_workflowrun",))
    assert listed(viewer, everything) == {str(run.pk)}


# -- keyed on a search attribute --------------------------------------------------------


def test_a_search_attribute_equal_to_the_primary_key(
    entry: LedgerEntry, entry_runs: list[WorkflowRun]
) -> None:
    shown = LedgerEntryAdmin.runs_by_attribute(entry)
    assert run_ids(shown) == [str(run.pk) for run in reversed(entry_runs)][:3]
    (everything,) = [link for link in links(shown) if "/change/" not in link]
    assert parse_qs(urlsplit(everything).query) == {"q": [f"ledger_id={entry.pk}"]}
    viewer = logged_in("viewer", permissions=("view_workflowrun",))
    assert listed(viewer, everything) == {str(run.pk) for run in entry_runs}


def test_a_search_attribute_with_a_value_of_its_own(entry: LedgerEntry) -> None:
    tagged = make_run("any-1", search_attributes={"ledger": "k1", "region": "north"})
    make_run("any-2", search_attributes={"ledger": "k2"})
    field = related_runs(search_attribute="ledger", value=lambda obj: obj.key)
    shown = field(entry)
    assert run_ids(shown) == [str(tagged.pk)]
    assert parse_qs(urlsplit(field.changelist_url(entry) or "").query) == {"q": ["ledger=k1"]}
    # A value the search box cannot say: the runs are listed, without a link to the list.
    spaced = make_run("any-3", search_attributes={"ledger": "k 1"})
    field = related_runs(search_attribute="ledger", value=lambda obj: "k 1")
    assert field.changelist_url(entry) is None
    assert run_ids(field(entry)) == [str(spaced.pk)]


# -- edges --------------------------------------------------------------------------------


def test_no_runs_and_an_unsaved_object(entry: LedgerEntry) -> None:
    assert LedgerEntryAdmin.runs_by_id(entry) == "none"
    assert LedgerEntryAdmin.runs_by_attribute(entry) == "none"
    assert "not saved" in LedgerEntryAdmin.runs_by_id(LedgerEntry(key="new"))
    assert "not saved" in LedgerEntryAdmin.runs_by_id(None)


def test_the_workflow_id_and_workflow_name_are_escaped(entry: LedgerEntry) -> None:
    make_run("ledger-k1", workflow="<script>x</script>")
    shown = LedgerEntryAdmin.runs_by_id(entry)
    assert "<script>" not in shown and "&lt;script&gt;" in shown


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"workflow_id": "a-{pk}", "search_attribute": "a"},
        {"search_attribute": "a__b"},
        {"search_attribute": "1a"},
        {"search_attribute": "a b"},
        {"workflow_id": "a-{pk}", "value": lambda obj: obj.pk},
        {"workflow_id": "a-{pk}", "limit": 0},
    ],
)
def test_a_wrong_configuration_is_refused_at_once(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        related_runs(**options)


def test_the_admin_checks_accept_the_fields() -> None:
    assert LedgerEntryAdmin(LedgerEntry, site).check() == []
    assert isinstance(LedgerEntryAdmin.runs_by_id, RelatedRuns)
    assert repr(LedgerEntryAdmin.runs_by_id) == "related_runs(workflow_id='ledger-{key}')"


# -- on the object's admin page -----------------------------------------------------------


def test_the_change_page_shows_the_runs_with_labels(
    entry: LedgerEntry, entry_runs: list[WorkflowRun]
) -> None:
    root = logged_in("root", superuser=True)
    with CaptureQueriesContext(connection) as queries:
        response = root.get(entry_url(entry))
    assert response.status_code == 200
    page = response.content.decode()
    assert "Runs of this entry" in page and "Runs tagged with it" in page
    assert page.count('class="weft-related-runs"') == 2
    assert page.count("all 5 runs") == 2
    assert '<link rel="stylesheet" href="/static/django_weft/admin.css">' in page  # badges styled
    run_queries = [q["sql"] for q in queries if "django_weft_workflowrun" in q["sql"]]
    # Per field: the page of runs, and their count because there are more than the limit.
    assert len(run_queries) == 4
    add = root.get(reverse("related_admin:testapp_ledgerentry_add"))
    assert add.status_code == 200 and "not saved" in add.content.decode()


@pytest.mark.postgres
def test_the_lookups_can_use_the_indexes(entry: LedgerEntry, entry_runs: list[WorkflowRun]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
    by_id = LedgerEntryAdmin.runs_by_id.runs(entry)[:21].explain()
    assert "weft_run_wfid_created" in by_id
    by_attribute = LedgerEntryAdmin.runs_by_attribute.runs(entry)[:21].explain()
    assert "weft_run_search_attrs_gin" in by_attribute


@override_settings(ROOT_URLCONF="tests.urls")
def test_the_main_admin_site_is_unchanged(db: None) -> None:
    root = logged_in("root", superuser=True)
    assert "ledgerentry" not in root.get(reverse("admin:index")).content.decode()
