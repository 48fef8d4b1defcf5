"""A worker process freezes what it loaded out of the garbage collector's walks, once,
unless ``WEFT_WORKER_GC_FREEZE`` is off. Each case runs in a Python process of its own
(freezing this one would change the rest of the suite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import gc, json, sys
import django
django.setup()
from django.conf import settings
if sys.argv[1] == "off":
    settings.WEFT_WORKER_GC_FREEZE = False
from django_weft.runtime import freeze_loaded_objects
first = freeze_loaded_objects()
again = freeze_loaded_objects()
print(json.dumps([first, again, gc.get_freeze_count()]))
"""


def frozen(setting: str) -> list[int]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, setting],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_worker_process_freezes_what_it_loaded_once() -> None:
    first, again, count = frozen("on")
    # Django, the apps and the registered workflows: many thousands of objects.
    assert first > 10_000 and count == first
    assert again == 0  # once per process


def test_weft_worker_gc_freeze_off_leaves_the_collector_as_it_was() -> None:
    assert frozen("off") == [0, 0, 0]
