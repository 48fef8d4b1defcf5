"""A worker process freezes what it loaded out of the garbage collector's walks, once,
unless ``WEFT_WORKER_GC_FREEZE`` is off; a Celery worker's main process does before its
pool starts, and its pool processes inherit that. Each case runs in a Python
process of its own (freezing this one would change the rest of the suite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WEFT_WORKER = """
import gc, json
import django
django.setup()
from django_weft.runtime import freeze_loaded_objects
first = freeze_loaded_objects()
again = freeze_loaded_objects()
print(json.dumps([first, again, gc.get_freeze_count()]))
"""

CELERY_WORKER = """
import gc, json, logging, os
import django
django.setup()
from celery.signals import worker_init, worker_process_init, worker_ready
import django_weft.contrib.celery.signals  # noqa: F401  (the receivers)
froze = []
class Froze(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("froze the"):
            froze.append(record.getMessage())
runtime_logger = logging.getLogger("django_weft.runtime")
runtime_logger.setLevel(logging.INFO)
runtime_logger.addHandler(Froze())
worker_init.send(sender=None)
main = gc.get_freeze_count()
worker_ready.send(sender=None)  # the same process: nothing more
ready = len(froze)
read, write = os.pipe()
child = os.fork()
if child == 0:  # a prefork pool process: it inherits the frozen objects, and runs no collection
    os.close(read)
    inherited = gc.get_freeze_count()
    worker_process_init.send(sender=None)
    os.write(write, json.dumps([inherited, len(froze)]).encode())
    os._exit(0)
os.close(write)
os.waitpid(child, 0)
print(json.dumps([main, ready, *json.loads(os.read(read, 1000))]))
"""


def run(script: str, freeze: str = "on") -> list[int]:
    env = {
        **os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT),
        "WEFT_TEST_GC_FREEZE": freeze,
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_worker_process_freezes_what_it_loaded_once() -> None:
    first, again, count = run(WEFT_WORKER)
    # Django, the apps and the registered workflows: many thousands of objects.
    assert first > 10_000 and count >= first
    assert again == 0  # once per process


def test_weft_worker_gc_freeze_off_leaves_the_collector_as_it_was() -> None:
    assert run(WEFT_WORKER, freeze="off") == [0, 0, 0]
    assert run(CELERY_WORKER, freeze="off") == [0, 0, 0, 0]  # nothing frozen, nothing logged


def test_a_celery_worker_freezes_before_its_pool_starts_and_each_pool_process_after() -> None:
    main, ready, inherited, logged_in_child = run(CELERY_WORKER)
    assert main > 10_000
    assert ready == 1  # once per process: worker_ready in the same process froze nothing more
    assert inherited > main - 100  # forked: the main process's frozen objects (less a few freed since)
    assert logged_in_child == 1  # the parent's line only: the pool process froze nothing itself
