"""Workflow.start reaches the runtime through the Starter port, never the client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_weft.engine import ports
from django_weft.engine.errors import WeftError
from django_weft.engine.registry import Workflow


@pytest.fixture
def no_starter() -> Iterator[None]:
    installed = ports._starter
    ports.set_starter(None)
    yield
    ports.set_starter(installed)


def test_start_without_a_starter_says_how_to_install_one(no_starter: None) -> None:
    wf = Workflow(fn=lambda ctx: None, name="port.none")
    with pytest.raises(WeftError, match=r"no workflow starter is installed.*INSTALLED_APPS"):
        wf.start(1)


def test_start_calls_the_installed_starter(no_starter: None) -> None:
    calls: list[Any] = []

    def starter(workflow_name: str, /, *, args: list[Any], kwargs: dict[str, Any]) -> str:
        calls.append((workflow_name, args, kwargs))
        return "handle"

    ports.set_starter(starter)
    assert Workflow(fn=lambda ctx, *a, **k: None, name="port.set").start(1, 2, flag=True) == "handle"
    assert calls == [("port.set", [1, 2], {"flag": True})]
