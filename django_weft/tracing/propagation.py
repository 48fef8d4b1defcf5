"""W3C Trace Context carriers: the trace context stored with a run or a message, and read
back on whatever worker works on it, however much later.

The W3C propagator is used on its own, not the application's global propagator: the
stored carrier is documented as ``traceparent``/``tracestate`` whatever the application
propagates over HTTP (B3, Jaeger...), so a run started before a change of propagator is
still read the same way."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..engine.observe import Carrier

_W3C = TraceContextTextMapPropagator()


def current_carrier(context: Context | None = None) -> Carrier | None:
    """``context`` (the current one by default) as a carrier, or ``None`` when it holds no
    valid span (an untraced caller: nothing is stored)."""
    carrier: Carrier = {}
    _W3C.inject(carrier, context=context)
    return carrier or None


def context_of(carrier: Carrier | None) -> Context | None:
    """The context a stored carrier names, for a span to be its child; ``None`` for no
    carrier or one that holds no valid span context."""
    if not carrier:
        return None
    context = _W3C.extract(carrier)
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def span_context_of(carrier: Carrier | None) -> trace.SpanContext | None:
    """The span a stored carrier names, for a span link."""
    context = context_of(carrier)
    return None if context is None else trace.get_current_span(context).get_span_context()
