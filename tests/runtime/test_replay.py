"""Replaying stored histories against changed code (``runtime.replay_runs``): real runs,
made by running the workflows of ``tests/testapp/replay_workflows.py``, replayed with the
module's ``VARIANT`` changed as a deploy would change the code."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_weft import client, runtime
from django_weft.engine.errors import InvalidInput, WorkflowNotFound
from django_weft.engine.executor import TurnOutcome
from django_weft.engine.registry import Registry, registry
from django_weft.engine.replay import ReplayEnd, ReplayVerdict
from django_weft.models import WorkflowRun
from django_weft.testing import drive
from tests.support.replay_runs import cancelled_parent_run, every_row, handlers_run, order_runs, turn
from tests.testapp import replay_workflows
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def orders(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    return order_runs(monkeypatch)


@pytest.fixture
def handlers() -> str:
    return handlers_run()


def replay_all(**selection: Any) -> dict[str, runtime.RunReplay]:
    return {r.run_id: r for r in runtime.replay_runs(runtime.RunSelection(**selection))}


def test_unchanged_code_replays_every_run_and_writes_nothing(orders: dict[str, str]) -> None:
    before = every_row()
    with CaptureQueriesContext(connection) as queries:
        replays = replay_all()
    assert every_row() == before
    assert all(q["sql"].lstrip().upper().startswith("SELECT") for q in queries.captured_queries)
    by_name = {name: replays[run_id] for name, run_id in orders.items()}
    assert {name: r.verdict for name, r in by_name.items()} == dict.fromkeys(orders, ReplayVerdict.OK)
    assert by_name["finished"].result.end == ReplayEnd.RETURNED
    assert (by_name["finished"].result.replayed, by_name["finished"].result.history_length) == (3, 3)
    assert by_name["waiting"].result.end == ReplayEnd.END_OF_HISTORY
    assert by_name["fresh"].result.history_length == 0
    held = by_name["held"]
    assert held.held_at == 0 and not held.fails_check
    assert "retry it once this code is deployed" in held.line()


def test_reordered_steps_report_the_first_divergence_of_every_affected_run(
    orders: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_workflows, "VARIANT", "reordered")
    executed = SideEffect.objects.count()
    replays = replay_all(workflows=("tests.replay.order",))
    assert SideEffect.objects.count() == executed  # no activity ran
    for name in ("finished", "waiting", "running", "held"):
        replay = replays[orders[name]]
        assert replay.verdict == ReplayVerdict.DIVERGED and replay.fails_check, name
        divergence = replay.result.divergence
        assert divergence is not None
        assert divergence.position == 0
        assert divergence.recorded == {"kind": "activity", "name": "tests.replay.reserve"}
        assert divergence.requested == {"kind": "activity", "name": "tests.replay.charge"}
        assert (
            "at position 0 the history records activity 'tests.replay.reserve', "
            "the code asks for activity 'tests.replay.charge'" in replay.line()
        )
    assert "already failed for non-determinism" in replays[orders["held"]].line()
    # A run that has not reached the reordered steps is not affected.
    assert replays[orders["fresh"]].verdict == ReplayVerdict.OK


def test_a_change_behind_ctx_patched_replays_every_run(
    orders: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_workflows, "VARIANT", "patched")
    replays = replay_all()
    assert [r.line() for r in replays.values() if r.verdict != ReplayVerdict.OK] == []
    # And a run started under the patched code records the marker, and replays too.
    handle = client.start("tests.replay.order", args=["new"], kwargs={"wait": False})
    assert drive(handle.run_id) == "completed"
    kinds = [entry["kind"] for entry in handle.history()]
    assert kinds == ["patch", "activity", "activity", "activity"]
    assert replay_all(refs=(handle.run_id,))[handle.run_id].result.replayed == 4


# -- handlers, queries, recorded values, children, markers, cancellation requests --------


def test_handlers_queries_and_recorded_values_replay(handlers: str) -> None:
    kinds = [entry["kind"] for entry in client.get_handle(handlers).history()]
    assert {"handler", "side_effect", "search_attrs", "condition", "sleep"} <= set(kinds)
    before = every_row()
    replay = replay_all(refs=(handlers,))[handlers]
    assert every_row() == before
    assert replay.verdict == ReplayVerdict.OK, replay.line()
    assert replay.result.replayed == replay.result.history_length == len(kinds)
    assert replay.result.end == ReplayEnd.END_OF_HISTORY
    # What a query sees after the same replay: the handlers' effects, in order.
    state = client.get_handle(handlers).query("state")
    assert state["items"] == ["apple", "pear"] and state["address"] == {"city": "Oslo"}


def test_a_changed_update_handler_diverges_inside_the_handler(
    handlers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_workflows, "VARIANT", "handler_changed")
    replay = replay_all(refs=(handlers,))[handlers]
    assert replay.verdict == ReplayVerdict.DIVERGED
    divergence = replay.result.divergence
    assert divergence is not None
    history = client.get_handle(handlers).history()
    inner = next(e for e in history if e["kind"] == "activity" and e["name"] == "tests.replay.normalise")
    assert history[inner["seq"] - 1]["name"] == "update:address"  # the handler's own step comes first
    assert divergence.position == inner["seq"]
    assert divergence.requested == {"kind": "activity", "name": "tests.replay.geocode"}


def test_children_patch_markers_and_cancellation_requests_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    parent_run, child_run = cancelled_parent_run()
    replays = replay_all(refs=(parent_run, child_run))
    parent = replays[parent_run]
    assert parent.status == "cancelled" and parent.verdict == ReplayVerdict.OK, parent.line()
    assert parent.result.end == ReplayEnd.RAISED and "CancellationRequested" in parent.result.detail
    assert replays[child_run].verdict == ReplayVerdict.OK
    # Without its ctx.patched call, the code no longer matches the recorded marker.
    monkeypatch.setattr(replay_workflows, "VARIANT", "unpatched")
    diverged = replay_all(refs=(parent_run,))[parent_run]
    assert diverged.result.divergence is not None
    assert diverged.result.divergence.recorded == {"kind": "patch", "name": "child-first"}
    assert diverged.result.divergence.requested == {"kind": "child", "name": "tests.replay.child"}


# -- missing workflows ----------------------------------------------------------------------


def test_a_missing_workflow_fails_the_check_only_for_a_live_run() -> None:
    done = client.start("tests.replay.retired", args=["done"])
    assert turn(done.run_id) == TurnOutcome.PARKED
    done.signal("go")
    assert drive(done.run_id) == "completed"
    live = client.start("tests.replay.retired", args=["live"])
    assert turn(live.run_id) == TurnOutcome.PARKED
    without = Registry()
    without.workflows = {name: wf for name, wf in registry.workflows.items() if "retired" not in name}
    selection = runtime.RunSelection(workflows=("tests.replay.retired",))
    replays = {r.run_id: r for r in runtime.replay_runs(selection, workflows=without)}
    for run_id, fails in ((done.run_id, False), (live.run_id, True)):
        replay = replays[run_id]
        assert replay.verdict == ReplayVerdict.MISSING_WORKFLOW
        assert replay.fails_check is fails
        assert "no workflow named 'tests.replay.retired' is registered" in replay.line()
    summary = runtime.ReplaySummary()
    for replay in replays.values():
        summary.add(replay)
    assert summary.line() == "replayed 2 runs: 0 ok, 0 diverged, 2 missing workflow"
    assert summary.failed


# -- documents: export, files, round trips ---------------------------------------------------


def test_an_exported_file_replays_as_the_stored_run_does(
    handlers: str, orders: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_ids = [*orders.values(), handlers]
    for run_id in run_ids:
        (tmp_path / f"{run_id}.json").write_text(json.dumps(runtime.export_history(run_id)))
    for variant in ("original", "reordered", "handler_changed"):
        monkeypatch.setattr(replay_workflows, "VARIANT", variant)
        stored = {
            r.run_id: r.as_dict() for r in runtime.replay_runs(runtime.RunSelection(refs=tuple(run_ids)))
        }
        from_files = {r.run_id: r.as_dict() for r in runtime.replay_files([tmp_path])}
        for run_id in run_ids:
            assert from_files[run_id]["source"] == str(tmp_path / f"{run_id}.json")
            stored[run_id].pop("source"), from_files[run_id].pop("source")
            assert from_files[run_id] == stored[run_id], variant


def test_the_history_document_carries_what_replay_needs(handlers: str) -> None:
    document = runtime.export_history(handlers)
    assert document["format"] == "django_weft.history" and document["version"] == 1
    run = document["run"]
    assert run["run_id"] == handlers and run["workflow"] == "tests.replay.handlers"
    assert run["args"] == ["h"] and run["kwargs"] == {} and run["status"] == "waiting"
    steps = document["steps"]
    assert [step["seq"] for step in steps] == list(range(len(steps)))
    assert set(steps[0]) == {
        "seq", "kind", "name", "status", "attempt", "args", "result", "error", "started_at", "finished_at"
    }  # fmt: skip
    signals = [step for step in steps if step["name"] == "signal:item"]
    assert [step["result"]["payload"] for step in signals] == ["apple", "pear"]
    update = next(step for step in steps if step["name"] == "update:address")
    assert update["result"]["payload"] == {"city": " oslo "}
    assert update["result"]["outcome"] == {"ok": True, "result": {"city": "Oslo"}}
    # The document is plain JSON: it survives a text round trip unchanged.
    assert json.loads(json.dumps(document)) == document


def test_replaying_reads_runs_in_keyset_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    run_ids = [
        client.start("tests.replay.order", args=[f"b{i}"], kwargs={"wait": False}).run_id for i in range(5)
    ]
    for run_id in run_ids:
        assert drive(run_id) == "completed"
    with CaptureQueriesContext(connection) as queries:
        replayed = [r.run_id for r in runtime.replay_runs(runtime.RunSelection(), batch=2)]
    assert sorted(replayed) == sorted(run_ids) and len(replayed) == len(set(replayed))
    # Newest first; two queries (runs, then their steps) per batch of 2, and a last empty page.
    created = {str(pk): at for pk, at in WorkflowRun.objects.values_list("pk", "created_at")}
    assert replayed == sorted(run_ids, key=lambda run_id: (-created[run_id].timestamp(), uuid.UUID(run_id)))
    assert len(queries.captured_queries) == 2 * 3


def test_selection_filters_combine() -> None:
    old = client.start("tests.replay.order", args=["old"], kwargs={"wait": False})
    assert drive(old.run_id) == "completed"
    waiting = client.start("tests.replay.order", args=["w"])
    assert turn(waiting.run_id) == TurnOutcome.PARKED
    other = client.start("tests.replay.child", args=["c"]).run_id
    assert set(replay_all(statuses=("waiting",))) == {waiting.run_id}
    assert set(replay_all(workflows=("tests.replay.child",))) == {other}
    since = WorkflowRun.objects.get(pk=waiting.run_id).created_at
    assert set(replay_all(since=since)) == {waiting.run_id, other}
    assert set(replay_all(refs=(waiting.workflow_id,), statuses=("completed",))) == set()
    with pytest.raises(WorkflowNotFound):
        replay_all(refs=("no-such-run",))
    with pytest.raises(InvalidInput, match="unknown run status 'done'"):
        runtime.RunSelection(statuses=("done",))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format="something.else"), "format: must be 'django_weft.history'"),
        (lambda d: d.update(version=2), "version: this django_weft reads version 1; got 2"),
        (lambda d: d.pop("run"), "run: missing"),
        (lambda d: d["run"].pop("workflow"), "run.workflow: missing"),
        (lambda d: d["run"].update(args={"a": 1}), "run.args: must be list"),
        (lambda d: d["run"].update(created_at="yesterday"), "run.created_at: must be an ISO 8601"),
        (lambda d: d["steps"][1].update(seq=0), "steps[1].seq: must be a position (0 or more) used once"),
        (lambda d: d["steps"][0].pop("kind"), "steps[0].kind: missing"),
        (lambda d: d["steps"][0].update(attempt="1"), "steps[0].attempt: must be int"),
    ],
)
def test_a_bad_document_is_refused_saying_what_to_fix(change: Any, message: str) -> None:
    handle = client.start("tests.replay.order", args=["doc"], kwargs={"wait": False})
    assert drive(handle.run_id) == "completed"
    document = runtime.export_history(handle.run_id)
    change(document)
    with pytest.raises(InvalidInput) as caught:
        runtime.replay_document(document, source="orders.json")
    assert str(caught.value).startswith("orders.json: ")
    assert message in str(caught.value)


def test_bad_history_paths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="no such file or directory"):
        list(runtime.replay_files([tmp_path / "missing.json"]))
    with pytest.raises(InvalidInput, match="the directory has no"):
        list(runtime.replay_files([tmp_path]))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(InvalidInput, match=r"broken\.json: not JSON"):
        list(runtime.replay_files([tmp_path]))
