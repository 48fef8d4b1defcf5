"""The admin in a real browser: Debian's headless Chromium driven by Selenium through the
system ``chromedriver``, against pytest-django's ``live_server`` (a threaded WSGI server on
the test database).

Every test here is marked ``browser``. Without ``chromium`` and ``chromedriver`` on the
PATH the tests are skipped with the install command (``scripts/test`` installs both).
Screenshots go to ``WEFT_SCREENSHOT_DIR`` (default ``.screenshots/`` at the repository
root); ``docs/images/admin/`` holds the ones the docs show, made by these tests::

    WEFT_SCREENSHOT_DIR=/tmp/shots WEFT_TEST_DB=sqlite .venv/bin/python -m pytest tests/browser
    for f in /tmp/shots/*.png; do
        pngquant --quality=60-85 --force --output "docs/images/admin/${f##*/}" "$f"
    done
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from tests.support.chromium import headless_chromium
from tests.support.driver import Driver

PASSWORD = "correct horse battery staple"
ROOT = Path(__file__).resolve().parents[2]
ALL_PERMISSIONS = (
    "view_workflowrun",
    "add_workflowrun",
    "signal_workflowrun",
    "update_workflowrun",
    "cancel_workflowrun",
    "suspend_workflowrun",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.browser)
            # The pages' database work is tested on both databases with Django's test
            # client (tests/admin); the browser pass runs once, with SQLite.
            item.add_marker(pytest.mark.database_independent)


def _chromium() -> tuple[str, str] | None:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (binary, driver) if binary and driver else None


@dataclass
class Browser:
    """A logged-in (or not yet logged-in) headless Chromium on the live server."""

    web: Any  # selenium.webdriver.Chrome
    base: str

    def go(self, path: str) -> None:
        self.web.get(self.base + path)

    def login(self, username: str) -> None:
        from selenium.webdriver.common.by import By

        self.go("/admin/login/?next=/admin/")
        self.web.find_element(By.NAME, "username").send_keys(username)
        self.web.find_element(By.NAME, "password").send_keys(PASSWORD)
        self.web.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        self.find("#user-tools")

    def find(self, selector: str) -> Any:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.web, 10).until(
            expected_conditions.presence_of_element_located((By.CSS_SELECTOR, selector))
        )

    def all(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.web.find_elements(By.CSS_SELECTOR, selector))

    def screenshot(self, name: str, *, width: int = 1280) -> Path:
        """Save the page as ``<WEFT_SCREENSHOT_DIR>/<name>.png`` (the whole page's height;
        ``width`` for a page whose table needs more than the usual 1280 pixels)."""
        folder = Path(os.environ.get("WEFT_SCREENSHOT_DIR", ROOT / ".screenshots"))
        folder.mkdir(parents=True, exist_ok=True)
        if width != 1280:
            self.web.set_window_size(width, 900)  # the page's height depends on its width
        # The window's height includes the browser's own frame: add it, or the page's
        # last ~140 pixels are cut off.
        height = self.web.execute_script(
            "return document.documentElement.scrollHeight + window.outerHeight - window.innerHeight"
        )
        self.web.set_window_size(width, min(max(int(height), 600), 4000))
        path = folder / f"{name}.png"
        self.web.save_screenshot(str(path))
        self.web.set_window_size(1280, 900)
        return path


def make_user(username: str, *, superuser: bool = False, permissions: tuple[str, ...] = ()) -> Any:
    model = get_user_model()
    if superuser:
        return model.objects.create_superuser(username, password=PASSWORD)
    user = model.objects.create_user(username, password=PASSWORD, is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_weft", codename__in=permissions)
    )
    return user


@pytest.fixture(scope="session")
def chrome_paths() -> tuple[str, str]:
    found = _chromium()
    if found is None:
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    return found


@pytest.fixture
def browser(chrome_paths: tuple[str, str], live_server: Any, transactional_db: None) -> Iterator[Browser]:
    web = headless_chromium(*chrome_paths)
    web.implicitly_wait(0)
    try:
        yield Browser(web, live_server.url)
    finally:
        web.quit()


@pytest.fixture
def driver() -> Iterator[Driver]:
    """A worker thread running the runs' turns and firing their timers."""
    worker = Driver("browser-driver")
    yield worker
    worker.stop()
