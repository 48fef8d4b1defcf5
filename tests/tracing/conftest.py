from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_weft import tracing
from tests.support.tracing import memory_exporter


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process, its spans in memory (cleared before and after)."""
    exporter = memory_exporter()
    exporter.clear()
    tracing.install()
    yield exporter
    tracing.uninstall()
    exporter.clear()
