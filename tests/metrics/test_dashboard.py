"""The Grafana dashboard the docs offer (docs/how-to/django-weft-dashboard.json): every
query names metrics and labels that django_weft exports, so a renamed metric or label
breaks this test rather than a user's dashboard."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from django_weft.metrics import prometheus

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "django-weft-dashboard.json"


def exported_series() -> dict[str, set[str]]:
    """Each series name django_weft's metrics expose, with the labels it carries."""
    series: dict[str, set[str]] = {}
    for metric in vars(prometheus).values():
        if not isinstance(metric, Counter | Gauge | Histogram):
            continue
        name, labels = metric._name, set(metric._labelnames)
        if isinstance(metric, Counter):
            series[f"{name}_total"] = labels
        elif isinstance(metric, Histogram):
            series[f"{name}_bucket"] = labels | {"le"}
            series[f"{name}_sum"] = series[f"{name}_count"] = labels
        else:
            series[name] = labels
    return series


def targets() -> list[tuple[str, dict[str, Any]]]:
    board = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target) for panel in board["panels"] for target in panel["targets"]]


def labels_used(target: dict[str, Any]) -> set[str]:
    expr = target["expr"]
    used: set[str] = set()
    for clause in re.findall(r"\bby \(([^)]*)\)", expr):
        used |= {label.strip() for label in clause.split(",")}
    used |= set(re.findall(r"[{,]\s*([a-z_]+)\s*=~?", expr))
    used |= set(re.findall(r"\{\{\s*([a-z_]+)\s*\}\}", target.get("legendFormat", "")))
    return used - {"le"}


def test_the_dashboard_is_a_grafana_dashboard_on_a_prometheus_data_source_variable() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    (variable,) = board["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        assert panel["targets"], panel["title"]


def test_every_query_names_exported_metrics_and_their_labels() -> None:
    series = exported_series()
    assert "weft_schedule_to_start_seconds_bucket" in series  # the registry was read
    for title, target in targets():
        names = set(re.findall(r"\bweft_[a-z_]+\b", target["expr"]))
        assert names, (title, target["expr"])
        unknown = names - set(series)
        assert not unknown, f"{title!r} queries {sorted(unknown)}, which django_weft does not export"
        available = set().union(*(series[name] for name in names))
        missing = labels_used(target) - available
        assert not missing, f"{title!r} uses labels {sorted(missing)} that {sorted(names)} do not carry"


def test_the_dashboard_covers_what_the_docs_promise_it_shows() -> None:
    queried = " ".join(target["expr"] for _, target in targets())
    for metric in (
        "weft_runs_started_total",  # throughput
        'weft_runs_finished_total{status="failed"}',  # failures
        "weft_schedule_to_start_seconds_bucket",  # schedule-to-start p50/p99
        "weft_oldest_due_seconds",  # queue ages
        "weft_lease_takeovers_total",  # takeovers
        "weft_deposed_writes_total",
    ):
        assert metric in queried, metric
    assert "histogram_quantile(0.5," in queried and "histogram_quantile(0.99," in queried
