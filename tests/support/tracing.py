"""Test-only OpenTelemetry SDK wiring. The package never configures an SDK; the tests do,
as an application would: an in-memory exporter in the test process, a file of JSON lines
in a worker process (``WEFT_TEST_SPAN_FILE``, read by ``tests/settings.py``), and a
middleware standing in for an HTTP instrumentation (a server span per request, the child
of the request's ``traceparent`` header)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_lock = threading.Lock()
_memory: InMemorySpanExporter | None = None


def memory_exporter() -> InMemorySpanExporter:
    """This process's in-memory exporter, behind the global provider (set once: the API
    refuses to replace it)."""
    global _memory
    with _lock:
        if _memory is None:
            _memory = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(_memory))
            trace.set_tracer_provider(provider)
        return _memory


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """A finished span as plain data: what the tests compare, in a process or from a file."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "status_description": span.status.description,
        "links": [f"{link.context.span_id:016x}" for link in span.links],
        "events": [event.name for event in span.events],
    }


class JsonLinesExporter(SpanExporter):
    """Appends each finished span to a file, one JSON object a line (flushed at once: the
    process may be SIGKILLed right after)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(span), default=str) + "\n" for span in spans)
        with self._lock, self.path.open("a") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS


def export_to_file(path: str | Path) -> None:
    """Make this process's provider export to ``path`` (a worker process of a test)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    trace.set_tracer_provider(provider)


def read_span_file(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class RequestSpanMiddleware:
    """A ``SERVER`` span around each request, continuing the caller's ``traceparent``: what
    an HTTP instrumentation of the application does (the tests install none)."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response
        self.propagator = TraceContextTextMapPropagator()

    def __call__(self, request: Any) -> Any:
        carrier = {"traceparent": request.headers.get("traceparent", "")}
        parent = self.propagator.extract(carrier) if carrier["traceparent"] else None
        tracer = trace.get_tracer("tests.http")
        with tracer.start_as_current_span(
            f"{request.method} {request.path}", context=parent, kind=trace.SpanKind.SERVER
        ):
            return self.get_response(request)
