"""`manage.py serve` started where another instance already runs.

granian, the default web server, binds with SO_REUSEPORT: a second granian on a busy port does not
fail, it shares the port and the kernel splits the browsers' connections between the two. So a
second `serve` on the same port (another data dir, or the orphans of a killed one) would silently
answer half the requests from another instance. It must refuse at once instead, before it
migrates or starts anything.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import ROOT, free_port

SERVE = [sys.executable, "manage.py", "serve", "--no-demo-alive", "--demo-hosts", "8", "--concurrency", "1"]


def _embedded_env(var: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "REDIS_URL"}}
    env.update({"DEBUG": "1", "OPSPLANNER_VAR_DIR": str(var)})
    return env


def _wait_or_stop(process: subprocess.Popen, timeout: float) -> int | None:
    """The exit code, or None (after stopping it and its children) if it still runs after timeout."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        return None


@pytest.mark.slow
def test_a_second_serve_on_a_port_already_served_refuses_at_once_and_starts_nothing(tmp_path: Path) -> None:
    port = free_port()
    # What the first instance's granian holds: a listener bound with SO_REUSEPORT.
    first = socket.socket()
    first.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    first.bind(("127.0.0.1", port))
    first.listen()
    var = tmp_path / "var"
    try:
        started = time.monotonic()
        second = subprocess.Popen(
            [*SERVE, "--port", str(port)],
            cwd=ROOT,
            env=_embedded_env(var),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        code = _wait_or_stop(second, timeout=40)
        output = second.stdout.read() if second.stdout else ""
    finally:
        first.close()
    assert code == 1, f"serve kept running on a port another instance serves:\n{output[-3000:]}"
    assert time.monotonic() - started < 20
    assert f"127.0.0.1:{port} is already in use" in output, output
    assert "Traceback" not in output
    assert not (var / "log" / "web.log").exists()  # no child was started
    assert not (var / "opsplanner.sqlite3").exists()  # nor was anything migrated


def _descendants(pid: int) -> set[int]:
    """Every process under pid (Linux /proc)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except FileNotFoundError:
            continue
        for child in map(int, children):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


@pytest.mark.slow
def test_closing_the_terminal_of_serve_stops_its_children_too(tmp_path: Path) -> None:
    """`make run` in a terminal that is closed: serve gets SIGHUP. Its children run in their own
    sessions (so Ctrl-C reaches serve alone), so nothing else stops them: serve must, as on Ctrl-C,
    or the web server, the worker and the beat run on with nobody to stop them."""
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        serve = subprocess.Popen(
            [*SERVE, "--port", str(port)], cwd=ROOT, env=_embedded_env(tmp_path / "var"), stdout=sink, stderr=sink
        )
    children: set[int] = set()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and serve.poll() is None:
            if "login: executor" in log.read_text():
                children = _descendants(serve.pid)
                if len(children) >= 3:
                    break
            time.sleep(0.3)
        assert len(children) >= 3, log.read_text()[-3000:]
        time.sleep(1)
        children = _descendants(serve.pid)  # with their own children (granian's worker, Celery's pool)
        serve.send_signal(signal.SIGHUP)
        serve.wait(timeout=40)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(pid) for pid in children):
            time.sleep(0.3)
        left = [pid for pid in children if _alive(pid)]
        assert not left, f"still running after serve got SIGHUP: {left}"
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGINT)
            serve.wait(timeout=40)
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


@pytest.mark.slow
def test_ctrl_c_while_the_web_worker_still_starts_leaves_nothing_running(tmp_path: Path) -> None:
    """Ctrl-C right after start: granian's main process waits for its worker still importing the
    application and is killed after the grace period; its worker must not live on holding the port."""
    port = free_port()
    var = tmp_path / "var"
    web_log = var / "log" / "web.log"
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        serve = subprocess.Popen(
            [*SERVE, "--port", str(port)], cwd=ROOT, env=_embedded_env(var), stdout=sink, stderr=sink
        )
    groups: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and serve.poll() is None:
            if web_log.exists() and "Spawning worker" in web_log.read_text():
                groups = sorted(_descendants(serve.pid))  # each child leads its own process group
                break
            time.sleep(0.05)
        assert groups, log.read_text()[-3000:]
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=60)
        time.sleep(1)
        left = {pgid: _group_members(pgid) for pgid in groups if _group_members(pgid)}
        assert not left, f"left running after serve stopped: {left}\n{web_log.read_text()[-2000:]}"
    finally:
        if serve.poll() is None:
            serve.kill()
        for pgid in groups:
            for pid in _group_members(pgid):
                os.kill(pid, signal.SIGKILL)
