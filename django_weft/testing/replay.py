"""Exported histories as test cases: the deploy check of ``manage.py weft_replay``, run
by the project's own test suite.

Export some runs once (``manage.py weft_export_history RUN > tests/histories/RUN.json``,
or ``--output-dir tests/histories`` for many), commit the files, and add::

    from pathlib import Path

    import pytest

    from django_weft.testing.replay import assert_replays, history_params

    HISTORIES = Path(__file__).parent / "histories"


    @pytest.mark.parametrize("history", history_params(HISTORIES))
    def test_recorded_histories_still_replay(history):
        assert_replays(history)

Each file is one test, named after the file. A code change that would stop one of those
runs fails its test with the position, what the history records and what the code asks
for. The replay needs no database (it reads the file and calls the workflow code; the
test needs no ``django_db`` mark) and runs no activity.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..engine.errors import InvalidInput
from ..engine.registry import Registry, registry
from ..engine.replay import ReplayVerdict
from ..runtime.histories import load_history_file
from ..runtime.replay import RunReplay, replay_document

__all__ = ["assert_replays", "history_params", "replay_history_file"]


def history_params(directory: str | Path, *, pattern: str = "*.json") -> list[Any]:
    """One ``pytest.param`` per history file in ``directory`` (matching ``pattern``, sorted
    by name, subdirectories included), each with the file's path relative to the
    directory as its test id. A directory without history files gives one skipped case
    that says so; a directory that does not exist is an error (a wrong path should not
    pass silently)."""
    root = Path(directory)
    if not root.is_dir():
        raise InvalidInput(
            f"{root}: no such directory of history files; export some with "
            f"`manage.py weft_export_history --output-dir {root}`"
        )
    files = sorted(path for path in root.rglob(pattern) if path.is_file())
    if not files:
        return [
            pytest.param(None, id="no-histories", marks=pytest.mark.skip(reason=f"no {pattern} in {root}"))
        ]
    return [pytest.param(path, id=path.relative_to(root).as_posix()) for path in files]


def replay_history_file(history: str | Path | dict[str, Any], *, workflows: Registry = registry) -> RunReplay:
    """Replay one history (a file's path, or a document already loaded) against the
    registered workflows; raises ``InvalidInput`` if it is not a history document."""
    if isinstance(history, dict):
        return replay_document(history, source="the history document", workflows=workflows)
    path = Path(history)
    if path.is_dir():
        raise InvalidInput(f"{path}: a directory; give one history file (history_params lists a directory's)")
    return replay_document(load_history_file(path), source=str(path), workflows=workflows)


def assert_replays(
    history: str | Path | dict[str, Any],
    *,
    allow_missing_workflow: bool = False,
    workflows: Registry = registry,
) -> RunReplay:
    """Fail the test unless the current code replays ``history`` (a file's path, or a
    document): a divergence fails it with the position, the recorded and the requested
    operation and the engine's explanation; so does a workflow this code does not
    register, unless ``allow_missing_workflow``. Returns the :class:`RunReplay` for
    further checks (``.result.end``, ``.result.replayed``)."""
    __tracebackhide__ = True
    replay = replay_history_file(history, workflows=workflows)
    if replay.verdict == ReplayVerdict.DIVERGED:
        divergence = replay.result.divergence
        assert divergence is not None
        raise AssertionError(
            f"{replay.source}: the current code does not replay run {replay.run_id} ({replay.workflow}, "
            f"{replay.status}): {replay.finding()}.\n{divergence.message}"
        )
    if replay.verdict == ReplayVerdict.MISSING_WORKFLOW and not allow_missing_workflow:
        raise AssertionError(
            f"{replay.source}: {replay.result.detail} (run {replay.run_id}). If the workflow was removed "
            "on purpose, delete this history file or pass allow_missing_workflow=True"
        )
    return replay
