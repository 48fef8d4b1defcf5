"""The engine must not import Django, Celery or DRF; the package imports before setup()."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "django_weft"
ENGINE = PACKAGE / "engine"
BLOCKED_MODULES = ("django", "celery", "rest_framework", "kombu")

BLOCK = f"""
import sys
for name in {BLOCKED_MODULES!r}:
    sys.modules[name] = None  # any import of them now raises ImportError
"""

BLOCKED = (
    BLOCK
    + """
import importlib, pkgutil
import django_weft.engine
# Every module of the engine, its test support included, found by walking the package.
for module in pkgutil.walk_packages(django_weft.engine.__path__, "django_weft.engine."):
    importlib.import_module(module.name)
import django_weft
print("ok", django_weft.RetryPolicy().max_attempts)
"""
)

ENGINE_TESTS = (
    BLOCK
    + """
import pytest
sys.exit(pytest.main([
    "tests/engine", "-q", "-p", "no:cacheprovider", "-p", "pytest_timeout", "--confcutdir", "tests/engine",
    "--deselect", "tests/engine/test_import_boundaries.py::test_engine_tests_pass_without_django",
]))
"""
)


def test_engine_and_package_import_without_django() -> None:
    out = subprocess.run(
        [sys.executable, "-c", BLOCKED], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok 3"


def test_engine_tests_pass_without_django() -> None:
    # Entry-point plugins are not loaded (pytest-django would import Django), and the
    # suite's top-level conftest is out of reach (--confcutdir): it configures Django.
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = subprocess.run(
        [sys.executable, "-c", ENGINE_TESTS], cwd=REPO, capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert " passed" in out.stdout


def _imports(path: Path) -> list[str]:
    """The absolute names of the modules ``path`` imports."""
    module = ".".join(path.relative_to(REPO).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base)
            names += [target] if node.module else [f"{target}.{alias.name}" for alias in node.names]
    return names


def test_the_engine_imports_no_framework_and_nothing_of_the_package_outside_it() -> None:
    # Workflow.start reaches the client through the Starter port (engine/ports.py).
    outside = {
        f"{path.relative_to(REPO)}: {name}"
        for path in ENGINE.rglob("*.py")
        for name in _imports(path)
        if name.partition(".")[0] in BLOCKED_MODULES
        or (name.startswith("django_weft") and not name.startswith("django_weft.engine"))
    }
    assert outside == set()


def test_nothing_in_the_package_imports_the_engine_test_support() -> None:
    testing = ENGINE / "testing"
    importers = {
        str(path.relative_to(REPO))
        for path in PACKAGE.rglob("*.py")
        if testing not in path.parents
        and any(name.startswith("django_weft.engine.testing") for name in _imports(path))
    }
    assert importers == set()
