"""A workflow that a worker process can be started without: a process whose environment
has ``WEFT_TEST_WITHOUT_LATE=1`` does not import this module, as a worker deployed
before the workflow was added (or with it left out of its modules) would not."""

from __future__ import annotations

from typing import Any

from django_weft import RetryPolicy, activity, workflow


@activity(name="tests.late.shout", retry=RetryPolicy(max_attempts=1))
def shout(text: str) -> str:
    return text.upper()


@workflow(name="tests.late.greet")
def greet(ctx: Any, name: str) -> str:
    return ctx.run(shout, f"hello {name}")
