"""The prepared statements of a turn find the run row by its primary key, whatever the
statistics say (store/sql.py ``OWNED_BY_KEY``), and the sweep's probe reads each part's
partial index (its values written into its text: ``StoreSql.with_values``).

A prepared statement keeps one plan. Planned while the table's statistics say few runs
are owned or running (most are finished), a fence written ``owner_id = %s`` was served
from the partial index of owned runs, and a claim's ``status = 'running'`` from the
index of runs by status: each read every entry of that index, one per owned or running
run and one per claim since the last vacuum. These tests plan the statements from such
statistics, generically as a prepared statement is planned after its fifth execution,
and read the plans PostgreSQL used (``auto_explain``, sent to this connection)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from django_weft import client
from django_weft.engine.executor import TurnOutcome
from django_weft.models import WorkflowRun
from django_weft.runtime.process import get_store
from django_weft.testing import make_engine

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

FINISHED_RUNS = 3000
RUN_SCAN = re.compile(
    r"(Seq Scan|Index Scan|Index Only Scan|Bitmap Heap Scan) "
    r"(?:using (\S+) )?on django_weft_workflowrun(?: (\w+))?"
)


def _finished_runs(count: int) -> None:
    """``count`` finished runs, copies of one run of ``tests.echo``, and fresh statistics
    that say the table's runs are finished."""
    template = client.start("tests.echo", args=[0]).run_id
    assert make_engine().run_turn(template) == TurnOutcome.COMPLETED
    table = WorkflowRun._meta.db_table
    columns = [field.column for field in WorkflowRun._meta.concrete_fields]
    copied = ", ".join(
        "gen_random_uuid()"
        if column == "id"
        else "'copy-' || g"
        if column == "workflow_id"
        else f't."{column}"'
        for column in columns
    )
    names = ", ".join(f'"{column}"' for column in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({names}) SELECT {copied} FROM {table} t, generate_series(1, %s) g "
            "WHERE t.id = %s",
            [count, template],
        )
        # Each copy has a timer that fired and an update that was answered: statistics
        # that say the unfired timers and the pending updates are few.
        copies = f"FROM {table} WHERE workflow_id LIKE 'copy-%%'"
        cursor.execute(
            "INSERT INTO django_weft_timer (run_id, seq, kind, fire_at, fired_at, created_at) "
            f"SELECT id, 0, 'sleep', now(), now(), now() {copies}"
        )
        cursor.execute(
            "INSERT INTO django_weft_update (run_id, update_id, name, status, validated, created_at, "
            f"updated_at) SELECT id, 'answered', 'bump', 'completed', true, now(), now() {copies}"
        )
        for name in ("workflowrun", "step", "signal", "update", "timer"):
            cursor.execute(f"ANALYZE django_weft_{name}")


@pytest.fixture
def plans() -> Iterator[list[str]]:
    """The plan of every statement this connection runs from here on, each planned
    generically (``plan_cache_mode``), as ``auto_explain`` reports it."""
    _finished_runs(FINISHED_RUNS)
    connection.ensure_connection()
    raw: Any = connection.connection
    seen: list[str] = []

    def collect(diagnostic: Any) -> None:
        if "Query Text:" in (diagnostic.message_primary or ""):
            seen.append(diagnostic.message_primary)

    raw.add_notice_handler(collect)
    with connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        cursor.execute("SET auto_explain.log_min_duration = 0")
        cursor.execute("SET client_min_messages = 'log'")
        cursor.execute("SET plan_cache_mode = 'force_generic_plan'")
    try:
        yield seen
    finally:
        raw.remove_notice_handler(collect)
        with connection.cursor() as cursor:
            for setting in ("auto_explain.log_min_duration", "client_min_messages", "plan_cache_mode"):
                cursor.execute(f"RESET {setting}")


def _run_scans(plans: list[str], statement: str) -> list[tuple[str, str]]:
    """The scans of the run table (kind, index) in the plans of the statements that
    start with ``statement``, outside the scans of other runs (aliased)."""
    found = [plan for plan in plans if re.search(r"Query Text: " + re.escape(statement), plan)]
    assert found, f"no statement starting {statement!r} was run"
    return [
        (kind, index or "")
        for plan in found
        for kind, index, alias in RUN_SCAN.findall(plan)
        if alias in ("", "django_weft_workflowrun_1")
    ]


def test_a_turns_fenced_statements_read_the_run_by_its_key(plans: list[str]) -> None:
    engine = make_engine()
    waiting = client.start("tests.m.wait_with_timeout", kwargs={"timeout": 600}).run_id
    stepping = client.start("tests.sleepy", kwargs={"seconds": 0}).run_id
    assert engine.run_turn(waiting) == TurnOutcome.PARKED
    client.get_handle(waiting).signal("go", "now")
    assert engine.run_turn(waiting) == TurnOutcome.COMPLETED
    assert engine.run_turn(stepping) == TurnOutcome.COMPLETED

    # The claim, the step write's fence, a wait's step with its signal, the completion.
    for statement in ("WITH old AS", "WITH fence AS (SELECT", "WITH done AS"):
        scans = _run_scans(plans, statement)
        assert scans and all(index == "django_weft_workflowrun_pkey" for _, index in scans), (
            statement,
            scans,
        )
    # A completion fails the run's pending updates, and it and a wait's step drop the
    # run's unfired timers, found by the run, not among every pending update or unfired
    # timer.
    completions = [plan for plan in plans if "Query Text: WITH done AS" in plan]
    waits = [plan for plan in plans if "Query Text: WITH fence AS (SELECT" in plan and "dropped AS" in plan]
    assert completions and waits
    assert not any("weft_update_pending" in plan for plan in completions)
    assert not any(
        "weft_timer_unfired" in plan or "weft_timer_kind_due" in plan for plan in completions + waits
    )


def test_the_sweeps_probe_reads_each_parts_partial_index(plans: list[str]) -> None:
    """The probe's values (statuses, kinds, workflow names) are written into its text
    (``StoreSql.with_values``): a generic plan of ``status = $1`` could not use the
    partial index of runnable runs (its predicate names ``'running'``) and read every
    running run from the index by status instead."""
    get_store().probe.pending(grace=30, workflows=["tests.echo"], dispatch=True)
    (probe,) = [plan for plan in plans if "Query Text: SELECT EXISTS" in plan]
    assert "$1" not in probe.split("Query Text:", 1)[1].split("\n", 1)[0]
    assert "using weft_run_runnable on django_weft_workflowrun" in probe
