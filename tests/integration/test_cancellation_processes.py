"""A cancellation request across a worker SIGKILLed while the run receives it: the next
owner delivers it exactly once, and the compensation step is recorded once."""

from __future__ import annotations

import signal

import pytest

from django_weft import WorkflowCancelled, client
from django_weft.models import Step, WorkflowRun
from tests.testapp.models import SideEffect

from .conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def count(key: str) -> int:
    return SideEffect.objects.filter(key=key).count()


@pytest.mark.parametrize(
    ("faults", "recorded", "releases"),
    [
        # Killed after the request's entry was computed, before its commit: nothing of it
        # is recorded, and the request is still pending for the next owner.
        ("before_cancel_delivery:kill", ["activity", "sleep"], 1),
        # Killed just after the entry's commit (the reservation's commit was the 1st):
        # the next owner replays it from the history, it is not delivered again.
        ("after_step_commit:kill:2", ["activity", "sleep", "cancel_request"], 1),
        # Killed after the compensation ran, before its step's commit: the activity runs
        # again (activities are at least once), and its step is recorded once.
        ("before_step_commit:kill:3", ["activity", "sleep", "cancel_request"], 2),
    ],
)
def test_a_request_is_delivered_once_across_a_worker_killed_while_receiving_it(
    start_worker,  # type: ignore[no-untyped-def]
    faults: str,
    recorded: list[str],
    releases: int,
) -> None:
    handle = client.start("tests.x.saga", args=["pk"])
    first = start_worker(faults=faults)
    wait_for(lambda: WorkflowRun.objects.get(pk=handle.run_id).status == "waiting", 20, "the run to sleep")
    handle.cancel("shutting down", mode="request")
    assert first.wait(30) == -signal.SIGKILL
    steps = Step.objects.filter(run_id=handle.run_id).order_by("seq")
    assert list(steps.values_list("kind", flat=True)) == recorded
    pending = WorkflowRun.objects.get(pk=handle.run_id).cancel_request["seq"] is None
    assert pending is (recorded[-1] != "cancel_request")

    start_worker()
    with pytest.raises(WorkflowCancelled) as caught:
        handle.result(timeout=40)
    assert caught.value.reason == "shutting down"
    assert list(steps.values_list("seq", "kind")) == [
        (0, "activity"),
        (1, "sleep"),
        (2, "cancel_request"),
        (3, "activity"),
    ]
    assert count("pk:reserve") == 1 and count("pk:release") == releases and count("pk:ship") == 0
    run = WorkflowRun.objects.get(pk=handle.run_id)
    assert run.cancel_request["seq"] == 2 and run.owner_epoch >= 3
