"""``GET runs/{ref}/export/``: a run's history as a ``django_weft.history`` document,
the same as ``weft_export_history`` writes, replayed identically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from django_weft import client, runtime
from django_weft.testing import drive
from tests.testapp import replay_workflows

from .conftest import Api, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def without_stamp(document: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in document.items() if key != "exported_at"}


def test_the_export_route_serves_the_command_s_document_and_it_replays_the_same(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = client.start("tests.replay.order", args=["rest"], kwargs={"wait": False}, id="order-rest")
    assert drive(handle.run_id) == "completed"
    response = api.get(f"runs/{handle.workflow_id}/export/?format=json")
    assert response.status_code == 200, response.text
    served = response.json()
    assert without_stamp(served) == without_stamp(runtime.export_history(handle.run_id))
    assert served["run"]["workflow_id"] == "order-rest" and len(served["steps"]) == 3
    (tmp_path / "rest.json").write_text(response.text)
    for variant in ("original", "reordered"):
        monkeypatch.setattr(replay_workflows, "VARIANT", variant)
        [from_file] = runtime.replay_files([tmp_path / "rest.json"])
        [from_db] = runtime.replay_runs(runtime.RunSelection(refs=(handle.run_id,)))
        assert {**from_file.as_dict(), "source": None} == {**from_db.as_dict(), "source": None}
    assert from_file.result.divergence is not None  # the reordered code diverges


def test_the_export_route_needs_the_view_permission_and_hides_unknown_runs(api: Api) -> None:
    run_id = client.start("tests.replay.child", args=["perm"]).run_id
    make_user("no-view", staff=True, permissions=["add_workflowrun"])
    assert api.as_user("no-view").get(f"runs/{run_id}/export/").status_code == 403
    missing = api.get("runs/no-such-run/export/")
    assert missing.status_code == 404
    assert json.loads(missing.text)["error"]["code"] == "not_found"
