"""``manage.py demo_order`` starts its orders' runs with the priority it is given, in the
range the runtime takes (django_weft's operations catalogue says it)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_weft.models import WorkflowRun
from example_project.orders.models import Order


def test_demo_order_starts_its_run_with_the_priority_given(weft) -> None:
    out = StringIO()
    call_command("demo_order", "--priority", "-7", stdout=out)
    assert WorkflowRun.objects.get(workflow_name="orders.fulfil").priority == -7
    call_command("demo_order", stdout=out)
    assert sorted(WorkflowRun.objects.values_list("priority", flat=True)) == [-7, 0]


@pytest.mark.parametrize("priority", ["101", "-101", "1.5", "high"])
def test_a_priority_the_runtime_would_refuse_is_refused_before_any_order(weft, priority: str) -> None:
    with pytest.raises(CommandError, match=r"priority must be a whole number from -100 to 100"):
        call_command("demo_order", "--priority", priority, stdout=StringIO())
    assert not Order.objects.exists() and not WorkflowRun.objects.exists()
