"""Headless Chromium (Debian's ``chromium`` + ``chromium-driver``) driven by Selenium, offline.

Also a small command for the README's screenshots of a running console:

    python -m tests.support.browser http://127.0.0.1:6066/console docs/console [RECORD_ID]

writes ``docs/console-overview.png`` and, with a record id, ``docs/console-lookup.png`` (the
record looked up, the first dead letter ticked for replay).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# No network beyond the page: no QUIC, no component or safe-browsing updates, no sync, no first-run.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1900",
)


def missing() -> str | None:
    """Why no browser can be started here (None when it can)."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            return (
                f"{path} is missing: bin/setup installs Debian's {package} "
                "(apt-get install -y chromium chromium-driver)"
            )
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[test]'"
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium with a fresh profile, closed (and the profile removed) on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="delayapp-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console's messages: CSP violations
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver: Any, path: str) -> str:
    """Save the whole page (the window grown to the page's height) as a PNG."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, max(900, min(int(height) + 40, 4000)))
    driver.save_screenshot(path)
    return path


if __name__ == "__main__":
    import time

    url, stem, record = sys.argv[1], sys.argv[2], (sys.argv[3:] or [None])[0]
    with chromium() as browser:
        browser.get(url)
        time.sleep(5)  # a command for people, not a test: let the page refresh twice
        print(screenshot(browser, f"{stem}-overview.png"))
        if record:
            browser.find_element("id", "lookup-id").send_keys(record)
            browser.find_element("id", "lookup-go").click()
            boxes = browser.find_elements("css selector", "#dlq-latest input[type=checkbox]:not([disabled])")
            if boxes:
                boxes[0].click()
            time.sleep(1)
            browser.execute_script("document.getElementById('lookup-id').scrollIntoView()")
            print(screenshot(browser, f"{stem}-lookup.png"))
