"""The example project's Order admin page lists the order's fulfilment runs
(``related_runs`` keyed on the order's workflow id), rendered by the example's own settings
in a child process on a fresh SQLite state folder. No worker: the runs stay where they
were started."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

SCRIPT = """
import json

import django

django.setup()
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from django_weft import client
from example_project.orders.models import Order

call_command("migrate", verbosity=0)
root = get_user_model().objects.create_superuser("root", password="not-used")
order = Order.objects.create(customer="Ada Lovelace", amount="42.00")
other = Order.objects.create(customer="Grace Hopper", amount="7.00")
first = client.start("orders.fulfil", args=[order.pk], id=order.workflow_id)
client.get_handle(first.run_id).cancel(reason="customer changed the address")
second = client.start(
    "orders.fulfil", args=[order.pk], id=order.workflow_id, on_conflict="start_new_if_terminal"
)
client.start("orders.fulfil", args=[other.pk], id=other.workflow_id)
web = Client(HTTP_HOST="127.0.0.1")
web.force_login(root)
page = web.get(f"/admin/orders/order/{order.pk}/change/")
print(json.dumps({
    "status": page.status_code,
    "html": page.content.decode(),
    "runs": [second.run_id, first.run_id],
}))
"""


@pytest.mark.database_independent  # the example's own settings and SQLite database
def test_the_order_page_lists_its_fulfilment_runs(tmp_path: Path) -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"}
    }
    env.update(
        WEFT_EXAMPLE_VAR_DIR=str(tmp_path / "var"),
        DJANGO_SETTINGS_MODULE="example_project.settings",
        PYTHONPATH=str(REPO),
    )
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == 200
    page = result["html"]
    assert "Fulfilment runs" in page
    shown = re.findall(r'<tr data-run="([^"]+)">', page)
    assert shown == result["runs"]  # this order's two runs, newest first; not the other order's
    assert "weft-badge-cancelled" in page
    for run_id in result["runs"]:
        assert f'href="/admin/django_weft/workflowrun/{run_id}/change/"' in page
    assert 'href="/admin/django_weft/workflowrun/?q=order-1"' in page
