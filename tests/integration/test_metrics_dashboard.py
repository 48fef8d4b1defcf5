"""The Grafana dashboard's queries (docs/how-to/django-weft-dashboard.json) against a real
Prometheus scraping real ``weft_worker`` processes: every panel that has something to
show shows it, and a screenshot of the queries over that data is made for the docs
(``docs/images/observe/``, from ``WEFT_SCREENSHOT_DIR``).

Needs Debian's ``prometheus`` package (``scripts/test`` installs it with Chromium).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client import REGISTRY, CollectorRegistry, multiprocess, start_http_server

from django_weft import client, metrics
from tests.support.chromium import headless_chromium
from tests.support.services import free_port
from tests.support.waiting import wait_until

# What is checked is the metrics and the queries over them, whatever the database: once,
# in the SQLite pass.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.database_independent]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "how-to" / "django-weft-dashboard.json"
RATE_INTERVAL = "15s"
"""What Grafana's ``$__rate_interval`` comes to with a one-second scrape interval and a
short range."""
NOTHING_TO_SHOW = {"Schedule fires, by outcome"}
"""Panels the workload gives nothing to (no schedule fires in it)."""


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A Prometheus of the test's own scraping an exporter of the workers' metrics files:
    ``(its base URL, the PROMETHEUS_MULTIPROC_DIR)``."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Prometheus is not installed (apt-get install prometheus)")
    directory = tmp_path / "metrics"
    directory.mkdir()
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    workers_port, client_port, port = free_port(), free_port(), free_port()
    # Two targets, as a deployment scrapes its workers and its web processes: the workers'
    # files, and this process (which starts the runs) with its own registry.
    servers = [
        start_http_server(workers_port, addr="127.0.0.1", registry=registry)[0],
        start_http_server(client_port, addr="127.0.0.1", registry=REGISTRY)[0],
    ]
    metrics.enable()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: django_weft\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{workers_port}', '127.0.0.1:{client_port}']}}]\n"
    )
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: ready(base), "Prometheus answers", timeout=30)
        yield base, directory
    finally:
        process.terminate()
        process.wait(timeout=30)
        metrics.disable()
        for server in servers:
            server.shutdown()
        log.close()


def ready(base: str) -> bool:
    try:
        return requests.get(f"{base}/-/ready", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def query(base: str, expr: str) -> list[dict[str, Any]]:
    # Prometheus has answered 200 with an empty body while busy: asked again, up to thrice.
    for attempt in range(3):
        answer = requests.get(f"{base}/api/v1/query", params={"query": expr}, timeout=10)
        assert answer.status_code == 200, (expr, answer.text)
        try:
            return list(answer.json()["data"]["result"])
        except requests.JSONDecodeError:
            if attempt == 2:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def panels() -> list[dict[str, Any]]:
    return list(json.loads(DASHBOARD.read_text())["panels"])


def expression(target: dict[str, Any]) -> str:
    return str(target["expr"]).replace("$__rate_interval", RATE_INTERVAL)


def test_every_panel_of_the_dashboard_shows_a_real_workload(  # type: ignore[no-untyped-def]
    start_worker, prometheus: tuple[str, Path]
) -> None:
    base, directory = prometheus
    env = {
        "WEFT_TEST_METRICS": "1",
        "PROMETHEUS_MULTIPROC_DIR": str(directory),
        "WEFT_TEST_METRICS_SAMPLE_INTERVAL": "0.5",
    }
    workers = [start_worker(env_vars=env) for _ in range(2)]
    # Runs queued behind one per customer (they hold their slot until signalled).
    held = [client.start("tests.flow.per_key", args=[customer]) for customer in ["acme"] * 4 + ["globex"] * 2]
    handles = []
    started = time.monotonic()
    index = 0
    while time.monotonic() - started < 20:
        handles.append(client.start("tests.obs.mixed", args=[index]))
        index += 1
        time.sleep(0.2)
    for handle in held[:1] + held[4:5]:
        handle.signal("go")
    wait_until(
        lambda: all(h.status() in {"completed", "failed"} for h in handles), "the runs to end", timeout=60
    )
    assert all(worker.alive() for worker in workers)
    time.sleep(3)  # a few more scrapes after the last run ended

    empty = []
    for panel in panels():
        results = [query(base, expression(target)) for target in panel["targets"]]
        if not any(results):
            empty.append(panel["title"])
    assert set(empty) == NOTHING_TO_SHOW, f"panels with nothing to show: {empty}"
    # The figures are the workload's: the failed share, the queued runs per key.
    queued = {
        r["metric"]["key"]: float(r["value"][1]) for r in query(base, "max by (key) (weft_queued_runs)")
    }
    assert queued == {"acme": 2.0, "globex": 0.0}, queued
    failed = query(base, 'sum(weft_runs_finished_total{status="failed"})')
    assert float(failed[0]["value"][1]) == len([i for i in range(index) if i % 9 == 0])

    screenshot(base)


def screenshot(base: str) -> None:
    """The dashboard's main queries in Prometheus's own graph page, over the workload."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        return  # the assertions above are the test; the picture is for the docs
    shown = ["Runs finished per second, by status", "Schedule to start, p50 and p99", "Oldest due item",
             "Activity attempts per second, by outcome"]  # fmt: skip
    params: dict[str, str] = {}
    graphs = [t for p in panels() if p["title"] in shown for t in p["targets"]][:5]
    for number, target in enumerate(graphs):
        params.update(
            {f"g{number}.expr": expression(target), f"g{number}.tab": "0", f"g{number}.range_input": "45s"}
        )
    web = headless_chromium(chromium, driver)
    try:
        web.get(f"{base}/classic/graph?{urllib.parse.urlencode(params)}")
        time.sleep(3)  # the graphs draw after their queries answer
        height = web.execute_script("return document.documentElement.scrollHeight")
        web.set_window_size(1280, min(max(int(height) + 140, 600), 6000))
        folder = Path(os.environ.get("WEFT_SCREENSHOT_DIR", ROOT / ".screenshots"))
        folder.mkdir(parents=True, exist_ok=True)
        web.save_screenshot(str(folder / "dashboard-queries.png"))
    finally:
        web.quit()
