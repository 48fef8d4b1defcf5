"""Debounced starts from two processes at once: the starts of one key collapse into one
run, decided in the database (on PostgreSQL under the key's advisory lock; on SQLite by
its one writer and the unique index of pending bursts)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from django_weft.models import Timer, WorkflowRun
from tests.support.processes import REPO, GroupProcess

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STARTS = 25

# Waits for the agreed moment, then starts the same key as fast as it can, printing what
# each start returned.
STARTER = f"""
import json, sys, time
import django
django.setup()
from django_weft import client
go, process = float(sys.argv[1]), int(sys.argv[2])
time.sleep(max(go - time.time(), 0))
for i in range({STARTS}):
    n = process * 100 + i
    began = time.time()
    handle = client.start("tests.debounce.reindex", args=["products"], kwargs={{"n": n}})
    print(json.dumps([n, handle.run_id, began, time.time()]), flush=True)
"""


def starter(tmp_path: Path, process: int, go: float) -> GroupProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(REPO))
    if connection.vendor == "sqlite":
        env.update(WEFT_TEST_DB="sqlite", WEFT_TEST_SQLITE_NAME=str(connection.settings_dict["NAME"]))
    else:
        env.update(WEFT_TEST_DB="postgres", WEFT_TEST_PG_NAME=str(connection.settings_dict["NAME"]))
    argv = [sys.executable, "-c", STARTER, str(go), str(process)]
    return GroupProcess(tmp_path / f"starter-{process}.log", argv, env)


def test_two_processes_starting_the_same_key_collapse_into_one_run(tmp_path: Path) -> None:
    go = time.time() + 5  # both have imported Django and connected by then
    processes = [starter(tmp_path, process, go) for process in (1, 2)]
    try:
        for process in processes:
            assert process.process.wait(120) == 0, process.log
        returned = [
            json.loads(line) for p in processes for line in p.log.splitlines() if line.startswith("[")
        ]
    finally:
        for process in processes:
            process.stop()
    assert len(returned) == 2 * STARTS, [p.log for p in processes]
    # The two streams of starts overlapped in time: their starts were concurrent.
    spans = [(min(r[2] for r in mine), max(r[3] for r in mine)) for mine in
             ([r for r in returned if r[0] // 100 == process] for process in (1, 2))]  # fmt: skip
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans
    (run,) = WorkflowRun.objects.filter(workflow_name="tests.debounce.reindex")
    assert {r[1] for r in returned} == {str(run.pk)}
    assert (run.status, run.debounce_key, run.debounced_starts) == ("pending", "products", 2 * STARTS)
    # The last start to commit is the last start of one of the processes.
    assert run.kwargs["n"] % 100 == STARTS - 1
    assert Timer.objects.filter(run=run, kind="delayed_start", fired_at__isnull=True).count() == 1
