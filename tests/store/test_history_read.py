"""The history read gives every step's times exactly as stored (PostgreSQL reads them as
microseconds since the epoch)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from django_weft import client
from django_weft.models import Step
from django_weft.store import DjangoStore
from django_weft.testing import make_engine

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2027, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 500001, tzinfo=UTC),
        datetime(2262, 4, 11, 23, 47, 16, 854775, tzinfo=UTC),
    ],
)
def test_step_times_are_read_to_the_microsecond(moment: datetime) -> None:
    handle = client.start("tests.ls.one_quiet_step", args=[1])
    make_engine().run_turn(handle.run_id)
    Step.objects.filter(run_id=handle.run_id).update(started_at=moment, finished_at=moment)
    (record,) = DjangoStore().sql.load_steps(handle.run_id).values()
    assert record.started_at == moment and record.finished_at == moment
    assert record.started_at.utcoffset() is not None
    stored = Step.objects.get(run_id=handle.run_id)
    assert (record.started_at, record.finished_at) == (stored.started_at, stored.finished_at)
