"""Debian's headless Chromium through the system ``chromedriver``, as every browser test
drives it."""

from __future__ import annotations

from typing import Any

ARGUMENTS = ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
             "--window-size=1280,900", "--lang=en-US")  # fmt: skip


def headless_chromium(binary: str, driver: str) -> Any:
    """A new ``selenium.webdriver.Chrome`` on ``binary`` (the caller quits it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ARGUMENTS:
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(driver), options=options)
