"""What the admin's run page reads through the runtime: the object a run was started for
(``related_object``) and the handlers a run has registered (``registered_handlers``)."""

from __future__ import annotations

import pytest

from django_weft import client, runtime
from django_weft.engine.errors import InvalidInput
from django_weft.models import WorkflowRun
from django_weft.testing import make_engine
from tests.testapp.models import LedgerEntry

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_related_object_is_stored_as_its_search_attribute_and_found_by_it() -> None:
    entry = LedgerEntry.objects.create(key="k1", amount=3)
    handle = client.start("tests.echo", args=["x"], related_object=entry, search_attributes={"customer": 7})
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.search_attributes == {"customer": 7, "weft_object": f"testapp.ledgerentry:{entry.pk}"}
    found = WorkflowRun.objects.search(weft_object=f"testapp.ledgerentry:{entry.pk}")
    assert list(found.values_list("pk", flat=True)) == [run.pk]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (LedgerEntry(key="unsaved", amount=1), "is not saved"),
        ("testapp.ledgerentry:1", "must be a model instance; got str"),
        (42, "must be a model instance; got int"),
    ],
)
def test_a_related_object_that_is_not_a_saved_instance_is_refused_and_nothing_starts(
    value: object, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        client.start("tests.echo", args=["x"], related_object=value)
    assert not WorkflowRun.objects.exists()


def test_registered_handlers_are_found_by_a_read_only_replay() -> None:
    handle = client.start("tests.m.cart", args=["c1"])
    make_engine().run_turn(handle.run_id)
    steps_before = list(WorkflowRun.objects.get(pk=handle.run_id).steps.values_list("seq", "status"))
    handlers = runtime.registered_handlers(handle.run_id)
    assert handlers is not None
    assert [(h.kind, h.hint) for h in handlers] == [
        ("query", "state()"),
        ("query", "count(plus=0)"),
        ("update", "address(new: 'dict[str, Any]') -> 'dict[str, Any]'"),
        ("update", "close(_payload: 'Any') -> 'str'"),
        ("update", "nap(_payload)"),
        ("update", "broken(_payload)"),
        ("signal", "add(item)"),
    ]
    # Nothing was written by the replay.
    assert list(WorkflowRun.objects.get(pk=handle.run_id).steps.values_list("seq", "status")) == steps_before


def test_registered_handlers_of_a_workflow_this_process_lacks_are_unknown() -> None:
    handle = client.start("tests.echo", args=["x"])
    WorkflowRun.objects.filter(pk=handle.run_id).update(workflow_name="gone.from.this.process")
    assert runtime.registered_handlers(handle.run_id) is None
