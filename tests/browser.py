"""Headless Chromium for the browser tests (Debian's chromium; chromium-driver for selenium).

One place for finding the browser and for the flags it needs here: as root Chromium refuses to start
without --no-sandbox, and nothing may reach the network.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import pytest

HEADLESS_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


def chromium() -> str | None:
    """The path of Debian's chromium, or None."""
    for c in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if c and os.path.exists(c):
            return c
    return None


def require(*programs: str) -> None:
    """Fail naming the fix when a browser program is missing (skip with CIRCUITSTAT_ALLOW_NO_BROWSER=1)."""
    missing = [p for p in programs if (chromium() if p == "chromium" else shutil.which(p)) is None]
    if not missing:
        return
    if os.environ.get("CIRCUITSTAT_ALLOW_NO_BROWSER") == "1":
        pytest.skip(f"{', '.join(missing)} not installed and CIRCUITSTAT_ALLOW_NO_BROWSER=1")
    packages = " ".join("chromium-driver" if p == "chromedriver" else p for p in missing)
    pytest.fail(f"the browser tests need {', '.join(missing)}: run `apt-get install -y {packages}` "
                "(`make test` does it), or set CIRCUITSTAT_ALLOW_NO_BROWSER=1 to skip them")


@contextlib.contextmanager
def chrome():
    """A selenium WebDriver of headless Chromium through chromium-driver, closed afterwards."""
    require("chromium", "chromedriver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="circuitstat-chrome-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium()
    for flag in HEADLESS_FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.implicitly_wait(10)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
