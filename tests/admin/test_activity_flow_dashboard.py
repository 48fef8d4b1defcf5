"""Activity flow control on the dashboard and in ``weft_status``, with Django's test
client and ``call_command``: the rate limit buckets that are behind (the rate in force,
how far ahead, about how many attempts) and the busiest activity concurrency groups
(slots held of the limit, attempts waiting), at most ten of each, in one query each.
On both databases."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_weft import runtime
from django_weft.engine.flow import Rate, to_micros
from django_weft.models import ActivitySlot, RateLimitBucket
from django_weft.runtime.process import get_store

from .conftest import logged_in, make_run

pytestmark = pytest.mark.django_db(transaction=True)

DASHBOARD = "admin:django_weft_workflowrun_dashboard"
PACED = Rate(5, 1.0)  # tests.paced: one every 200 ms


@pytest.fixture
def admin() -> Client:
    return logged_in("root", superuser=True)


def section_rows(admin: Client, section: str, marker: str) -> list[tuple[str, ...]]:
    """The rows (their cells' text) of the dashboard's section ``section``."""
    page = admin.get(reverse(DASHBOARD)).content.decode()
    body = page.split(f'id="{section}"', 1)[1].split("</section>", 1)[0]
    rows = []
    for row in re.findall(rf"<tr {marker}=.*?</tr>", body, re.DOTALL):
        cells = re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.DOTALL)
        rows.append(tuple(" ".join(html.unescape(re.sub(r"<[^>]+>", "", cell)).split()) for cell in cells))
    return rows


def status_table(title: str) -> list[list[str]]:
    out = StringIO()
    call_command("weft_status", stdout=out)
    printed = out.getvalue().split(f"{title}\n", 1)[1].splitlines()
    table = []
    for line in printed:
        if not line.startswith("  "):
            break
        table.append(line.split())
    return table


def seconds(text: str) -> float:
    """A duration the dashboard wrote, in seconds ("950 ms", "1.2 s", "3 min 5 s")."""
    if text.endswith(" ms"):
        return float(text[:-3]) / 1000
    if text.endswith(" s") and "min" not in text:
        return float(text[:-2])
    minutes, rest = text.split(" min ")
    return int(minutes) * 60 + int(rest.rstrip(" s"))


# -- rate limits ----------------------------------------------------------------------------


@override_settings(WEFT_RATE_LIMITS={"tests.per_account": "2/m"})
def test_the_rate_limits_behind_with_their_rate_and_backlog(admin: Client) -> None:
    assert section_rows(admin, "weft-rate-limits", "data-rate-limit") == []
    assert "No rate limit is behind" in admin.get(reverse(DASHBOARD)).content.decode()
    flow = get_store().activity_flow
    for _ in range(6):  # the first goes now; five more are given the next second's moments
        flow.grant("tests.paced", "", PACED)
    flow.grant("tests.per_account", "acct-1", Rate(2, 60.0))  # the override: one every 30 s
    flow.grant("tests.gone", "k", Rate(1, 3600.0))  # not registered here: its rate is unknown
    now = to_micros(timezone.now())
    RateLimitBucket.objects.create(name="tests.idle", key="", tat=now - 5_000_000)  # behind no more

    rows = section_rows(admin, "weft-rate-limits", "data-rate-limit")
    assert [row[:3] for row in rows] == [
        ("tests.gone", "k", "?"),
        ("tests.per_account", "acct-1", "2/60s"),
        ("tests.paced", "(no key)", "5/1s"),
    ]
    assert "(" not in rows[0][3]  # no attempts without a rate
    assert 59 * 60 <= seconds(rows[0][3]) <= 3600
    assert rows[1][3].endswith("(about 1 attempt)") and 29 <= seconds(rows[1][3].split(" (")[0]) <= 30
    # Six moments taken: the bucket is due 1.2 s after the first, about six attempts ahead.
    paced_ahead = seconds(rows[2][3].split(" (")[0])
    # (Less as time passes between taking the moments and reading them: a loaded machine.)
    assert 0.5 <= paced_ahead <= 1.2, rows[2]
    # About one attempt per 0.2 s ahead (the shown seconds are rounded: give it one either way).
    near = {round(paced_ahead / 0.2) + delta for delta in (-1, 0, 1)}
    assert any(rows[2][3].endswith(f"(about {n} attempts)") for n in near), rows[2]

    table = status_table("rate limits behind (at most 10):")
    assert table[0] == ["rate", "limit", "key", "rate", "next", "free", "in", "attempts"]
    assert [line[:3] for line in table[1:]] == [
        ["tests.gone", "k", "?"],
        ["tests.per_account", "acct-1", "2/60s"],
        ["tests.paced", "(no", "key)"],
    ]
    assert table[1][4] == "?" and table[2][4] == "~1"
    ahead = float(table[3][4].rstrip("s"))
    assert 0.5 <= ahead <= 1.2 and table[3][5] in {f"~{n}" for n in range(2, 7)}, table[3]


def test_at_most_ten_buckets_in_one_query(admin: Client) -> None:
    now = to_micros(timezone.now())
    for index in range(14):
        RateLimitBucket.objects.create(
            name="tests.paced", key=f"k{index:02}", tat=now + (index + 1) * 60_000_000
        )
    for index in range(30):
        RateLimitBucket.objects.create(name="tests.paced", key=f"idle{index:02}", tat=now - 60_000_000)
    rows = section_rows(admin, "weft-rate-limits", "data-rate-limit")
    assert [row[1] for row in rows] == [f"k{index:02}" for index in range(13, 3, -1)]
    with CaptureQueriesContext(connection) as queries:
        busy = runtime.busy_rate_limits(now=timezone.now())
    assert len(queries.captured_queries) == 1
    assert len(busy.buckets) == 10


# -- activity concurrency -----------------------------------------------------------------------


def take(activity: str, key: str, limit: int, run: str, seq: int = 1) -> bool:
    return get_store().activity_flow.take_slot(activity, key, limit, run, seq, 60, "dashboard").held


def test_the_busiest_activity_groups_held_of_the_limit_and_waiting(admin: Client) -> None:
    assert section_rows(admin, "weft-activity-concurrency", "data-activity-concurrency") == []
    runs = [str(make_run(f"r-{index}", status="running").pk) for index in range(7)]
    assert take("tests.af.slotted", "acct-1", 1, runs[0])
    assert not take("tests.af.slotted", "acct-1", 1, runs[1])
    assert not take("tests.af.slotted", "acct-1", 1, runs[2])
    assert take("tests.af.slotted", "acct-2", 1, runs[3])
    assert take("tests.af.two_at_once", "", 2, runs[4])
    assert take("tests.gone", "", 3, runs[5])
    # A slot whose lease ran out is free: its group neither holds nor waits.
    assert take("tests.af.slotted", "acct-3", 1, runs[6])
    ActivitySlot.objects.filter(key="acct-3").update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    ActivitySlot.objects.filter(run_id=runs[1]).update(created_at=timezone.now() - timedelta(minutes=4))

    rows = section_rows(admin, "weft-activity-concurrency", "data-activity-concurrency")
    assert [row[:4] for row in rows] == [
        ("tests.af.slotted", "acct-1", "1 / 1", "2"),
        ("tests.af.slotted", "acct-2", "1 / 1", "0"),
        ("tests.af.two_at_once", "(no key)", "1 / 2", "0"),
        ("tests.gone", "(no key)", "1 / ?", "0"),  # not registered here: its limit is unknown
    ]
    assert rows[0][4].startswith("4 min") and rows[1][4] == "none waiting"
    page = admin.get(reverse(DASHBOARD)).content.decode()
    full = page.split('data-activity-concurrency="tests.af.slotted acct-1"', 1)[1].split("</tr>", 1)[0]
    assert "weft-full" in full

    table = status_table("busiest activity concurrency (at most 10):")
    assert table[0] == ["activity", "key", "held", "waiting", "waiting", "longest"]
    assert (
        table[1][:4] == ["tests.af.slotted", "acct-1", "1/1", "2"] and float(table[1][4].rstrip("s")) >= 240
    )
    assert table[2] == ["tests.af.slotted", "acct-2", "1/1", "0", "-"]
    assert table[3] == ["tests.af.two_at_once", "(no", "key)", "1/2", "0", "-"]
    assert table[4] == ["tests.gone", "(no", "key)", "1/?", "0", "-"]


def test_at_most_ten_activity_groups_in_one_query(admin: Client) -> None:
    runs = [make_run(f"r-{index}", status="running") for index in range(14)]
    now = timezone.now()
    for index, run in enumerate(runs):
        lease = now + timedelta(minutes=1)
        ActivitySlot.objects.create(activity="tests.af.slotted", key=f"k{index:02}", run=run, seq=1,
                                    state="held", lease_expires_at=lease, created_at=now)  # fmt: skip
    for seq in range(2, 5):
        ActivitySlot.objects.create(activity="tests.af.slotted", key="k13", run=runs[0], seq=seq,
                                    state="waiting", created_at=now)  # fmt: skip
    rows = section_rows(admin, "weft-activity-concurrency", "data-activity-concurrency")
    assert len(rows) == 10
    assert rows[0][:4] == ("tests.af.slotted", "k13", "1 / 1", "3")
    assert [row[1] for row in rows[1:]] == [f"k{index:02}" for index in range(9)]
    with CaptureQueriesContext(connection) as queries:
        busiest = runtime.busiest_activity_groups(now=timezone.now())
    assert len(queries) == 1 and len(busiest.groups) == 10


def test_the_dashboard_reads_a_fixed_number_of_queries_whatever_the_buckets_and_slots(admin: Client) -> None:
    admin.get(reverse(DASHBOARD))
    with CaptureQueriesContext(connection) as empty:
        admin.get(reverse(DASHBOARD))
    now = to_micros(timezone.now())
    for index in range(25):
        RateLimitBucket.objects.create(name="tests.paced", key=f"k{index}", tat=now + 60_000_000)
        run = make_run(f"r-{index}", status="running")
        ActivitySlot.objects.create(activity="tests.af.slotted", key=f"k{index}", run=run, seq=1,
                                    state="waiting", created_at=timezone.now())  # fmt: skip
    with CaptureQueriesContext(connection) as full:
        response = admin.get(reverse(DASHBOARD))
    assert response.status_code == 200
    assert len(full) == len(empty), [query["sql"] for query in full.captured_queries]
