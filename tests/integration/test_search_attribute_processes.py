"""Search attributes set from workflow code, across a worker SIGKILLed around the step's
commit: present once, nothing lost, never written twice."""

from __future__ import annotations

import signal

import pytest

from django_weft import client
from django_weft.models import Step, WorkflowRun
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.mark.parametrize("point", ["after_step_commit", "before_step_commit"])
def test_attributes_survive_a_worker_killed_at_their_commit(start_worker, point: str) -> None:  # type: ignore[no-untyped-def]
    handle = client.start("tests.attrs.steps", args=["sk"], search_attributes={"region": "north"})
    # The first step commit is the attributes' (position 0): the worker dies just after
    # it committed, or just before.
    first = start_worker(faults=f"{point}:kill:1")
    assert first.wait(30) == -signal.SIGKILL
    committed = point == "after_step_commit"
    steps = Step.objects.filter(run_id=handle.run_id)
    assert list(steps.values_list("seq", "kind")) == ([(0, "search_attrs")] if committed else [])
    expected = {"region": "north", "order": "sk", "stage": "charging"} if committed else {"region": "north"}
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.search_attributes == expected  # the step and the attributes: both or neither
    assert WorkflowRun.objects.search(order="sk").exists() is committed  # searchable at once
    written = dict(steps.values_list("seq", "updated_at"))

    start_worker()
    assert handle.result(timeout=30) == "charged"
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.search_attributes == {"region": "north", "order": "sk", "stage": "charged"}
    assert run.owner_epoch == 2
    assert list(steps.order_by("seq").values_list("seq", "kind")) == [
        (0, "search_attrs"),
        (1, "activity"),
        (2, "search_attrs"),
    ]
    if committed:  # the replay returned the recorded step without writing it again
        assert Step.objects.get(run_id=handle.run_id, seq=0).updated_at == written[0]
    assert SideEffect.objects.filter(key="sk:charge").count() == 1
    found = WorkflowRun.objects.search(order="sk", stage="charged")
    assert list(found.values_list("pk", flat=True)) == [run.pk]
