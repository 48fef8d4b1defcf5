"""``manage.py weft_replay`` and ``weft_export_history`` as real processes, on stored runs
made by running the workflows, with the workflow code changed by the environment the
process starts with (``WEFT_TEST_REPLAY_VARIANT``, ``WEFT_TEST_REPLAY_RETIRED``; see
``tests/testapp/replay_workflows.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_weft import client
from django_weft.engine.executor import TurnOutcome
from django_weft.testing import drive
from tests.support.replay_runs import cancelled_parent_run, every_row, handlers_run, order_runs, turn

from .conftest import REPO

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def manage(*args: str, variant: str = "original", retired: bool = False, celery: bool = False) -> Any:
    """``python -m django <args>`` on the test database, with the code variant given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "WEFT_TEST_REPLAY"))}
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONPATH=str(REPO),
        WEFT_TEST_DB="sqlite" if connection.vendor == "sqlite" else "postgres",
        WEFT_TEST_REPLAY_VARIANT=variant,
    )
    if connection.vendor == "sqlite":
        env["WEFT_TEST_SQLITE_NAME"] = str(connection.settings_dict["NAME"])
    else:
        env["WEFT_TEST_PG_NAME"] = str(connection.settings_dict["NAME"])
    if retired:
        env["WEFT_TEST_REPLAY_RETIRED"] = "1"
    if celery:
        env["WEFT_TEST_CELERY"] = "1"  # the Celery dispatcher, on the test broker
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def broker_keys() -> int:
    import redis

    from tests.settings import CELERY_BROKER_URL

    return int(redis.Redis.from_url(CELERY_BROKER_URL).dbsize())


def lines_of(stdout: str) -> dict[str, str]:
    """The per-run lines by run id (the second field), and the summary under ``"summary"``."""
    lines = stdout.strip().splitlines()
    found = {line.split()[1]: line for line in lines[:-1]}
    found["summary"] = lines[-1]
    return found


@pytest.fixture
def stored(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Runs in every state, by name: the order workflow's (finished, waiting, running,
    fresh, held for non-determinism), one with handlers, a cancelled parent and its child,
    and two of the workflow a deploy retires (one finished, one waiting)."""
    runs: dict[str, str] = {}
    # First the runs made with a driver thread, which drives every runnable run.
    runs["handlers"] = handlers_run()
    runs["parent"], runs["child"] = cancelled_parent_run()
    runs.update({f"order-{name}": run_id for name, run_id in order_runs(monkeypatch).items()})
    done = client.start("tests.replay.retired", args=["done"])
    assert turn(done.run_id) == TurnOutcome.PARKED
    done.signal("go")
    assert drive(done.run_id) == "completed"
    runs["retired-done"] = done.run_id
    live = client.start("tests.replay.retired", args=["live"])
    assert turn(live.run_id) == TurnOutcome.PARKED
    runs["retired-live"] = live.run_id
    return runs


AFFECTED = ("order-finished", "order-waiting", "order-running", "order-held")


def test_weft_replay_reports_each_affected_run_after_a_reorder_and_passes_a_patched_change(
    stored: dict[str, str],
) -> None:
    before = every_row()
    total = len(stored)

    same = manage("weft_replay")
    assert same.returncode == 0, same.stderr
    lines = lines_of(same.stdout)
    assert lines["summary"] == f"replayed {total} runs: {total} ok, 0 diverged, 0 missing workflow"
    assert {run_id: lines[run_id].split()[0] for run_id in stored.values()} == dict.fromkeys(
        stored.values(), "OK"
    )
    assert "retry it once this code is deployed" in lines[stored["order-held"]]
    assert "[cancelled]: 5 of 5 positions replayed, then the workflow raises" in lines[stored["parent"]]

    reordered = manage("weft_replay", variant="reordered")
    assert reordered.returncode == 1, reordered.stderr
    lines = lines_of(reordered.stdout)
    assert lines["summary"] == f"replayed {total} runs: {total - 4} ok, 4 diverged, 0 missing workflow"
    for name in AFFECTED:
        line = lines[stored[name]]
        assert line.startswith(f"DIVERGED {stored[name]} tests.replay.order "), line
        assert line.endswith(
            "at position 0 the history records activity 'tests.replay.reserve', "
            "the code asks for activity 'tests.replay.charge'"
            + (" (the run already failed for non-determinism)" if name == "order-held" else "")
        ), line
    assert lines[stored["order-fresh"]].startswith("OK")
    assert "4 runs failed the replay check" in reordered.stderr

    patched = manage("weft_replay", variant="patched")
    assert patched.returncode == 0, patched.stdout + patched.stderr
    assert (
        lines_of(patched.stdout)["summary"]
        == f"replayed {total} runs: {total} ok, 0 diverged, 0 missing workflow"
    )

    assert every_row() == before


def test_weft_replay_quiet_json_and_filters(stored: dict[str, str]) -> None:
    quiet = manage("weft_replay", "--quiet", "--workflow", "tests.replay.order", variant="reordered")
    assert quiet.returncode == 1
    printed = quiet.stdout.strip().splitlines()
    assert sorted(line.split()[1] for line in printed[:-1]) == sorted(stored[name] for name in AFFECTED)
    assert printed[-1] == "replayed 5 runs: 1 ok, 4 diverged, 0 missing workflow"

    as_json = manage("weft_replay", "--format", "json", "--status", "waiting", variant="reordered")
    assert as_json.returncode == 1
    objects = [json.loads(line) for line in as_json.stdout.splitlines()]
    runs, summary = objects[:-1], objects[-1]
    assert {run["run_id"] for run in runs} == {
        stored["order-waiting"], stored["handlers"], stored["retired-live"]
    }  # fmt: skip
    waiting = next(run for run in runs if run["run_id"] == stored["order-waiting"])
    assert waiting["type"] == "run" and waiting["verdict"] == "diverged" and waiting["fails_check"]
    assert waiting["divergence"]["position"] == 0
    assert waiting["divergence"]["recorded"] == {"kind": "activity", "name": "tests.replay.reserve"}
    assert waiting["divergence"]["requested"] == {"kind": "activity", "name": "tests.replay.charge"}
    assert "is not deterministic" in waiting["divergence"]["message"]
    assert summary == {
        "type": "summary", "runs": 3, "ok": 2, "diverged": 1, "missing_workflow": 0, "failing": 1,
        "passed": False,
    }  # fmt: skip


def test_a_retired_workflow_fails_the_check_for_its_live_runs_only(stored: dict[str, str]) -> None:
    every = manage("weft_replay", retired=True)
    assert every.returncode == 1
    lines = lines_of(every.stdout)
    total = len(stored)
    assert lines["summary"] == f"replayed {total} runs: {total - 2} ok, 0 diverged, 2 missing workflow"
    assert lines[stored["retired-live"]].startswith(f"MISSING  {stored['retired-live']} tests.replay.retired")
    assert lines[stored["retired-live"]].endswith(
        "no workflow named 'tests.replay.retired' is registered in this code; "
        "the run could not go on after this deploy"
    )
    assert "not counted as a failure" in lines[stored["retired-done"]]
    assert "1 run failed the replay check" in every.stderr

    finished = manage("weft_replay", "--status", "completed", retired=True)
    assert finished.returncode == 0, finished.stdout
    assert "1 missing workflow" in finished.stdout


def test_exported_histories_replay_from_files_as_from_the_database(
    stored: dict[str, str], tmp_path: Path
) -> None:
    one = manage("weft_export_history", stored["handlers"])
    assert one.returncode == 0, one.stderr
    (tmp_path / "single").mkdir()
    (tmp_path / "single" / "handlers.json").write_text(one.stdout)
    exported = manage("weft_export_history", "--output-dir", str(tmp_path / "all"))
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.strip() == f"exported {len(stored)} runs to {tmp_path / 'all'}"
    assert (
        json.loads(one.stdout)["steps"]
        == json.loads((tmp_path / "all" / f"{stored['handlers']}.json").read_text())["steps"]
    )

    from_db = manage("weft_replay", variant="reordered", retired=True)
    from_files = manage(
        "weft_replay", "--from-file", str(tmp_path / "all"), variant="reordered", retired=True
    )
    assert (from_files.returncode, from_db.returncode) == (1, 1)
    assert sorted(from_files.stdout.splitlines()) == sorted(from_db.stdout.splitlines())
    single = manage("weft_replay", "--from-file", str(tmp_path / "single" / "handlers.json"))
    assert single.returncode == 0 and "replayed 1 run: 1 ok" in single.stdout


@pytest.mark.postgres
def test_weft_replay_sends_nothing_to_the_broker_even_with_the_celery_dispatcher(
    stored: dict[str, str],
) -> None:
    import redis

    from tests.settings import CELERY_BROKER_URL

    redis.Redis.from_url(CELERY_BROKER_URL).flushdb()
    before = every_row()
    done = manage("weft_replay", variant="patched", celery=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert broker_keys() == 0
    assert every_row() == before
