"""Browser tests' parts: the real ASGI server (daphne) on the test database, and headless Chromium
from the Debian packages driven by Playwright. Tests that use them must commit what the server
should see (`django_db(transaction=True)`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection

from tests.processes import ROOT, _process_env, free_port, test_database_url, wait_for

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = ROOT / "var" / "screenshots"


@dataclass
class LiveServer:
    url: str
    process: subprocess.Popen
    log: Path
    application_name: str  # its database connections' name in pg_stat_activity


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def live_server_process(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[LiveServer]:
    tmp_path = tmp_path_factory.mktemp("live-server")
    port = free_port()
    application_name = f"opsplanner-test-web-{port}"
    with django_db_blocker.unblock():
        database_url = f"{test_database_url()}?application_name={application_name}"
        env = _process_env(tmp_path, queue="unused-live-server", tag="web", extra={"DATABASE_URL": database_url})
    log = tmp_path / "daphne.log"
    with log.open("wb") as sink:
        command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    server = LiveServer(url=f"http://127.0.0.1:{port}", process=process, log=log, application_name=application_name)
    try:
        wait_for(lambda: _answers(server.url) or process.poll() is not None, timeout=60, what="the web server")
        if process.poll() is not None:
            raise AssertionError(f"the web server exited:\n{log.read_text()[-3000:]}")
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _server_queries(server: LiveServer) -> list[str]:
    """What the server's database connections are doing that is not idle (a query, or a transaction
    left open between two)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, query FROM pg_stat_activity WHERE application_name = %s AND state <> 'idle'",
            [server.application_name],
        )
        return [f"{state}: {query}" for state, query in cursor.fetchall()]


def wait_until_server_idle(server: LiveServer, *, timeout: float = 20.0, settle: float = 0.5) -> None:
    """Wait until the server's connections have been idle for `settle` seconds. A test's teardown
    empties the tables with one TRUNCATE of them all, which locks them one by one; a page the server
    was still rendering (a live update queued before the page closed) locks the same tables in another
    order, and PostgreSQL breaks that deadlock by failing one of the two, sometimes the TRUNCATE."""
    deadline = time.monotonic() + timeout
    idle_since = time.monotonic()
    while True:
        busy = _server_queries(server)
        now = time.monotonic()
        if busy:
            idle_since = now
        elif now - idle_since >= settle:
            return
        if now > deadline:
            raise AssertionError(f"the web server's database connections were still busy after {timeout:.0f}s: {busy}")
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def live_server_idle_before_flush(request: pytest.FixtureRequest) -> Iterator[None]:
    """For every test that uses the live server: its tables are emptied only once the server is idle."""
    server = request.getfixturevalue("live_server_process") if "live_server_process" in request.fixturenames else None
    yield
    if server is not None:
        wait_until_server_idle(server)


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    if not shutil.which(CHROMIUM):
        raise AssertionError(
            f"Chromium is not at {CHROMIUM}: install Debian's chromium (`.ci/run` does) or set CHROMIUM_PATH"
        )
    # Playwright's sync API keeps an event loop in this thread while it runs (module scope, so the
    # next modules get a plain thread back); the test's own ORM calls stay sync. Changes the pages
    # should see live are made with `committed_elsewhere`, as a worker would make them.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def committed_elsewhere(change: Callable[..., object], *, timeout: float = 120.0, **kwargs: object) -> None:
    """Run a service call in its own thread and connection (like a worker) and wait for its commit
    and its after-commit announcements."""
    errors: list[BaseException] = []

    def work() -> None:
        try:
            change(**kwargs)
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(error)
        finally:
            connection.close()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        # Going on would leave it writing while the test ends and its tables are emptied.
        raise AssertionError(f"{getattr(change, '__name__', change)} was still running after {timeout:.0f}s")
    if errors:
        raise errors[0]


def screenshot(page: object, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
    return path


def record(name: str, values: list[float]) -> Path:
    """Measurements a browser test takes (for BENCHMARKS.md), next to the screenshots."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.json"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    path.write_text(json.dumps({"values": values, "max": ordered[-1], "p95": p95}, indent=1))
    return path


def log_in(browser: object, server: LiveServer, username: str, password: str, *, enforce_csp: bool = False) -> object:
    """A page logged in as `username`. Pages skip the Content-Security-Policy unless asked to
    enforce it: Playwright compiles `wait_for_function` predicates with eval, which the policy
    forbids; tests/test_browser_csp.py runs the pages under the policy."""
    page = browser.new_page(bypass_csp=not enforce_csp)  # type: ignore[attr-defined]
    page.goto(f"{server.url}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_load_state()
    return page
