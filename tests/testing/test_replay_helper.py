"""``django_weft.testing.replay``: exported histories as test cases, without a database.

``tests/histories/`` holds histories exported from real runs of the workflows in
``tests/testapp/replay_workflows.py`` (tracebacks trimmed): a finished order, a run that
applied handlers and sleeps, a cancelled parent with a child and a patch marker, and a
run held for non-determinism. No test here has database access: pytest-django would fail
any that touched the database."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from django_weft.engine.errors import InvalidInput
from django_weft.engine.registry import Registry, registry
from django_weft.engine.replay import ReplayEnd
from django_weft.testing.replay import assert_replays, history_params, replay_history_file
from tests.testapp import replay_workflows

HISTORIES = Path(__file__).resolve().parents[1] / "histories"


@pytest.mark.parametrize("history", history_params(HISTORIES))
def test_recorded_histories_still_replay(history: Path) -> None:
    assert_replays(history)


def test_the_params_are_the_files_named_by_their_paths() -> None:
    params = history_params(HISTORIES)
    assert [param.id for param in params] == [
        "handlers-waiting.json", "order-completed.json", "order-held-for-nondeterminism.json",
        "parent-cancelled.json",
    ]  # fmt: skip
    assert [param.values[0] for param in params] == sorted(HISTORIES.glob("*.json"))


def test_a_divergence_fails_with_the_position_and_both_operations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay_workflows, "VARIANT", "reordered")
    with pytest.raises(AssertionError) as failure:
        assert_replays(HISTORIES / "order-completed.json")
    message = str(failure.value)
    assert message.startswith(f"{HISTORIES / 'order-completed.json'}: the current code does not replay run ")
    assert (
        "at position 0 the history records activity 'tests.replay.reserve', "
        "the code asks for activity 'tests.replay.charge'" in message
    )
    assert "guard the change with ctx.patched" in message
    monkeypatch.setattr(replay_workflows, "VARIANT", "handler_changed")
    with pytest.raises(AssertionError, match=r"activity 'tests\.replay\.geocode'"):
        assert_replays(HISTORIES / "handlers-waiting.json")
    assert_replays(HISTORIES / "order-completed.json")  # that change does not touch this workflow


def test_the_replay_is_returned_for_further_checks() -> None:
    document = json.loads((HISTORIES / "parent-cancelled.json").read_text())
    replay = assert_replays(document)
    assert replay.status == "cancelled" and replay.result.end == ReplayEnd.RAISED
    assert replay.result.replayed == len(document["steps"]) == 5
    held = replay_history_file(HISTORIES / "order-held-for-nondeterminism.json")
    assert held.held_at == 0 and "retry it once this code is deployed" in held.line()


def test_a_missing_workflow_fails_unless_allowed() -> None:
    without = Registry()
    without.workflows = {name: wf for name, wf in registry.workflows.items() if name != "tests.replay.order"}
    path = HISTORIES / "order-completed.json"
    with pytest.raises(AssertionError, match=r"no workflow named 'tests\.replay\.order' is registered"):
        assert_replays(path, workflows=without)
    assert assert_replays(path, workflows=without, allow_missing_workflow=True).verdict == "missing_workflow"


def test_directories_without_histories_and_bad_paths(tmp_path: Path) -> None:
    [skipped] = history_params(tmp_path)
    assert skipped.id == "no-histories" and skipped.marks[0].name == "skip"
    with pytest.raises(InvalidInput, match="no such directory of history files"):
        history_params(tmp_path / "missing")
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "a.json").write_text("{}")
    assert [param.id for param in history_params(tmp_path)] == ["nested/a.json"]
    with pytest.raises(InvalidInput, match=r"format: must be 'django_weft\.history'"):
        assert_replays(tmp_path / "nested" / "a.json")
    with pytest.raises(InvalidInput, match="a directory; give one history file"):
        assert_replays(tmp_path)


def test_weft_replay_from_files_needs_no_database() -> None:
    out = StringIO()
    call_command("weft_replay", "--from-file", str(HISTORIES), stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[-1] == "replayed 4 runs: 4 ok, 0 diverged, 0 missing workflow"
    assert [line.split()[0] for line in lines[:-1]] == ["OK"] * 4
