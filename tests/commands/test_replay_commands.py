"""``weft_replay`` and ``weft_export_history`` in this process: their options, their
output and their exit codes (1: a run fails the check; 2: input they cannot use). The
same commands run as real processes in ``tests/integration/test_replay_command.py``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_weft import client
from django_weft.management.commands._histories import parse_since
from django_weft.testing import drive
from tests.testapp import replay_workflows

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def refused(*args: str) -> CommandError:
    with pytest.raises(CommandError) as caught:
        run(*args)
    return caught.value


@pytest.fixture
def completed() -> str:
    handle = client.start("tests.replay.order", args=["cmd"], kwargs={"wait": False})
    assert drive(handle.run_id) == "completed"
    return handle.run_id


def test_a_failed_check_exits_with_1_after_the_report(
    completed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run("weft_replay").splitlines()[-1] == "replayed 1 run: 1 ok, 0 diverged, 0 missing workflow"
    monkeypatch.setattr(replay_workflows, "VARIANT", "reordered")
    error = refused("weft_replay")
    assert error.returncode == 1
    assert str(error).startswith("1 run failed the replay check")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("weft_replay", "--status", "done"), "unknown run status 'done'; a status is one of pending,"),
        (("weft_replay", "--since", "last week"), "--since takes a duration back from now (7d, 12h)"),
        (("weft_replay", "--run", "no-such-run"), "no workflow run has run id or workflow id 'no-such-run'"),
        (("weft_replay", "--from-file", "x.json", "--workflow", "w"), "use one or the other"),
        (("weft_replay", "--from-file", "/nonexistent/x.json"), "/nonexistent/x.json: no such file"),
        (("weft_export_history",), "name one run to write it to standard output"),
        (("weft_export_history", "a", "b"), "name one run to write it to standard output"),
        (("weft_export_history", "no-such-run"), "no workflow run has run id or workflow id 'no-such-run'"),
    ],
)
def test_input_the_commands_cannot_use_exits_with_2_saying_what_to_fix(
    args: tuple[str, ...], message: str
) -> None:
    error = refused(*args)
    assert error.returncode == 2
    assert message in str(error)


def test_a_file_that_is_not_a_history_exits_with_2(tmp_path: Path) -> None:
    (tmp_path / "runs.json").write_text(json.dumps({"results": [], "next": None}))  # a history page
    error = refused("weft_replay", "--from-file", str(tmp_path))
    assert error.returncode == 2
    assert str(error) == (
        f"{tmp_path / 'runs.json'}: format: must be 'django_weft.history'; got None "
        "(is this a weft history export?)"
    )


def test_export_writes_one_run_to_stdout_or_the_selected_runs_to_a_directory(
    completed: str, tmp_path: Path
) -> None:
    waiting = client.start("tests.replay.child", args=["w"]).run_id  # not driven: running, no step
    document = json.loads(run("weft_export_history", completed))
    assert document["run"]["run_id"] == completed and len(document["steps"]) == 3
    one_line = run("weft_export_history", completed, "--indent", "0")
    assert one_line.count("\n") == 1 and json.loads(one_line)["run"]["run_id"] == completed

    out = run(
        "weft_export_history", "--output-dir", str(tmp_path / "out"), "--status", "completed", "-v", "2"
    )
    assert out.splitlines() == [
        f"wrote {tmp_path / 'out' / f'{completed}.json'} (tests.replay.order {completed}, 3 steps)",
        f"exported 1 run to {tmp_path / 'out'}",
    ]
    every = run("weft_export_history", "--output-dir", str(tmp_path / "all"), "--batch", "1")
    assert every.strip() == f"exported 2 runs to {tmp_path / 'all'}"
    assert sorted(path.stem for path in (tmp_path / "all").iterdir()) == sorted([completed, waiting])
    replayed = run("weft_replay", "--from-file", str(tmp_path / "all"))
    assert replayed.splitlines()[-1] == "replayed 2 runs: 2 ok, 0 diverged, 0 missing workflow"


def test_since_takes_a_duration_or_a_date() -> None:
    now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    assert parse_since("7d", now) == now - timedelta(days=7)
    assert parse_since("90m", now) == now - timedelta(minutes=90)
    assert parse_since("2026-02-01T08:00:00+01:00") == datetime(2026, 2, 1, 7, 0, tzinfo=UTC)
    assert parse_since("2026-02-01") == datetime(2026, 2, 1, tzinfo=UTC)  # TIME_ZONE is UTC here
    assert parse_since(None) is None


def test_since_selects_runs_created_since_then(completed: str) -> None:
    assert "replayed 1 run:" in run("weft_replay", "--since", "1h")
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    assert (
        run("weft_replay", "--since", tomorrow).strip()
        == "replayed 0 runs: 0 ok, 0 diverged, 0 missing workflow"
    )
