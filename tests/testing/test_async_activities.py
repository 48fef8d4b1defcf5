"""The ``weft`` fixture runs ``async def`` activities, and mocks them with coroutines."""

from __future__ import annotations

from typing import Any

from tests.testapp import async_workflows


def test_the_fixture_runs_async_activities_inline_and_queued(weft) -> None:  # type: ignore[no-untyped-def]
    inline = weft.start(async_workflows.inline, "v")
    assert [entry["value"] for entry in inline.result()] == ["v", "v"]
    queued = weft.start(async_workflows.queued, "w")
    assert queued.result()["queued"] is True


def test_an_async_side_effect_mocks_an_activity(weft) -> None:  # type: ignore[no-untyped-def]
    async def instead(value: Any) -> str:
        return f"mocked {value}"

    mock = weft.mock_activity(async_workflows.describe_attempt, side_effect=instead)
    run = weft.start(async_workflows.inline, "v")
    assert run.result() == ["mocked v", "mocked v"]
    assert mock.call_count == 2
