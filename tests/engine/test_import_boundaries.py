"""The engine must not import Django, Celery or DRF; the package imports before setup()."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BLOCKED = """
import sys
for name in ("django", "celery", "rest_framework", "kombu"):
    sys.modules[name] = None  # any import of them now raises ImportError
import django_weft.engine.context, django_weft.engine.executor, django_weft.engine.registry
import django_weft.engine.durations, django_weft.engine.retry, django_weft.engine.codec
import django_weft.engine.faults, django_weft.engine.ports, django_weft.engine.records
import django_weft
print("ok", django_weft.RetryPolicy().max_attempts)
"""


def test_engine_and_package_import_without_django() -> None:
    out = subprocess.run(
        [sys.executable, "-c", BLOCKED], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok 3"
