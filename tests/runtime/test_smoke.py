from __future__ import annotations

import pytest

from django_weft import client
from django_weft.models import Step
from django_weft.testing import drive
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def test_ten_step_workflow_completes_with_ten_steps() -> None:
    handle = client.start("tests.ten_steps", args=["k"])
    assert drive(handle.run_id) == "completed"
    assert handle.result(timeout=1) == {"total": 45}
    steps = list(Step.objects.filter(run_id=handle.run_id).order_by("seq"))
    assert [s.seq for s in steps] == list(range(10))
    assert all(s.status == "completed" and s.attempt == 1 for s in steps)
    assert SideEffect.objects.filter(key__startswith="k:").count() == 10
