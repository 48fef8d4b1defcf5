"""Parallel test workers (pytest-xdist) each have their own virtual clock.

``test_each_worker_sees_only_its_own_clock`` starts its clock at a year that depends on
the xdist worker running it. Run alone it checks its own clock; run by
``test_two_xdist_workers_keep_their_own_clocks`` (``-n 2 --dist each``: both workers run
it at once) it also meets the other worker at two points, through files in
``WEFT_TEST_CLOCK_RENDEZVOUS``, so that the two runs overlap: each parks a run on its
clock, waits until the other has too, advances, waits until the other has too, and
checks that it saw only its own times while the other saw different ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from django_weft.models import Timer
from django_weft.runtime import get_store

from . import workflows as wf

REPO = Path(__file__).resolve().parents[2]
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "master")
RENDEZVOUS = os.environ.get("WEFT_TEST_CLOCK_RENDEZVOUS")


@pytest.fixture
def weft_start_time() -> datetime:
    # gw0 starts in 2030, gw1 in 2031...; a run without xdist in 2029.
    index = int(WORKER[2:]) + 1 if WORKER.startswith("gw") else 0
    return datetime(2029 + index, 3, 4, 5, 6, 7, tzinfo=UTC)


def _meet(phase: str, seen: str) -> dict[str, str]:
    """Leave ``seen`` for the other workers and wait until each has left theirs for
    ``phase``; returns what each saw, by worker. Without a rendezvous folder, only this
    worker's."""
    if RENDEZVOUS is None:
        return {WORKER: seen}
    folder = Path(RENDEZVOUS)
    (folder / f"{phase}.{WORKER}.tmp").write_text(seen)
    (folder / f"{phase}.{WORKER}.tmp").rename(folder / f"{phase}.{WORKER}")
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    deadline = time.monotonic() + 60
    while True:
        # A ".tmp" file is being written, and may be renamed before it could be read.
        done = [path for path in folder.glob(f"{phase}.gw*") if not path.name.endswith(".tmp")]
        found = {path.name.split(".", 1)[1]: path.read_text() for path in done}
        if len(found) >= workers:
            return found
        assert time.monotonic() < deadline, f"the other worker never reached {phase!r}: {found}"
        time.sleep(0.01)


def test_each_worker_sees_only_its_own_clock(weft, weft_start_time: datetime) -> None:
    start = weft_start_time
    run = weft.start(wf.sleeper, "1d")
    fire_at = Timer.objects.get(run_id=run.run_id).fire_at
    assert fire_at == start + timedelta(days=1)
    parked = _meet("parked", json.dumps({"now": weft.now().isoformat(), "fire_at": fire_at.isoformat()}))
    # The other worker has parked its run on its clock; this one's did not move.
    assert weft.now() == start and get_store().db_now() == start
    weft.advance("1d")
    finished = _meet("advanced", weft.now().isoformat())
    assert run.result() == {"before": start.isoformat(), "after": (start + timedelta(days=1)).isoformat()}
    assert weft.now() == get_store().db_now() == start + timedelta(days=1)
    others = {name: seen for name, seen in parked.items() if name != WORKER}
    for name, seen in others.items():
        assert json.loads(seen)["now"] != start.isoformat(), f"{name} had this worker's time"
        assert finished[name] != weft.now().isoformat()
    if RENDEZVOUS is not None:
        assert len(others) == int(os.environ["PYTEST_XDIST_WORKER_COUNT"]) - 1


@pytest.mark.slow
@pytest.mark.skipif(RENDEZVOUS is not None, reason="the outer test only")
def test_two_xdist_workers_keep_their_own_clocks(tmp_path: Path) -> None:
    # Test databases of its own (pytest-django names them <name>_gw0, _gw1), apart from
    # those of this run, which may be an xdist worker called gw0 itself.
    name = f"{os.environ.get('WEFT_TEST_PG_TEST_NAME', 'test_weft')}_clocks{WORKER.removeprefix('master')}"
    env = {**os.environ, "WEFT_TEST_CLOCK_RENDEZVOUS": str(tmp_path), "WEFT_TEST_PG_TEST_NAME": name}
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "each",
            f"{Path(__file__).relative_to(REPO)}::test_each_worker_sees_only_its_own_clock",
        ],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout, done.stdout[-2000:]
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "advanced.gw0", "advanced.gw1", "parked.gw0", "parked.gw1",
    ]  # fmt: skip
