"""The ASGI servers `serve` can run (settings.ASGI_SERVER), each started as a real process on the
test database: HTTP answers, and the live websocket connects and receives the push of a commit
made elsewhere (through the Redis channel layer), as it does under daphne."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from websockets.sync.client import connect

from fleet.models import HostState
from fleet.services import host_transition
from opsplanner.management.commands.serve import asgi_server_command
from opsplanner.roles import Role
from tests.builders import make_fleet
from tests.processes import ROOT, _process_env, free_port, wait_for
from tests.trains_builders import make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@contextmanager
def running(server: str, tmp_path: Path, workers: int = 1) -> Iterator[str]:
    """`server` serving config.asgi:application on the test database; yields its base URL."""
    port = free_port()
    env = _process_env(tmp_path, queue="unused-asgi-server", tag=server)
    env.update({"ALLOWED_HOSTS": "127.0.0.1,localhost", "ASGI_SERVER": server})
    log = tmp_path / f"{server}.log"
    with log.open("wb") as sink:
        command = asgi_server_command(server, host="127.0.0.1", port=port, workers=workers)
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(url) or process.poll() is not None, timeout=60, what=f"{server} to answer")
        assert process.poll() is None, f"{server} exited:\n{log.read_text()[-3000:]}"
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _session_cookie(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


@pytest.mark.parametrize(("server", "workers"), [("uvicorn", 2), ("granian", 2), ("daphne", 1)])
def test_the_server_answers_http_and_pushes_a_committed_change_over_the_live_websocket(
    server: str, workers: int, tmp_path: Path
) -> None:
    _, hosts = make_fleet(domains=1, hosts_per_domain=3, pool_name="asgi-east")
    cookie = _session_cookie(make_user(Role.VIEWER))
    with running(server, tmp_path, workers) as url:
        request = urllib.request.Request(f"{url}/api/pools/", headers={"Cookie": cookie, "Accept": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
            assert "asgi-east" in response.read().decode()
        ws_url = url.replace("http://", "ws://") + "/ws/live/"
        with connect(ws_url, additional_headers={"Cookie": cookie, "Origin": url}, open_timeout=10) as socket:
            socket.send(json.dumps({"watch": "overview", "params": {}}))
            assert '<td class="num in-service">3</td>' in socket.recv(timeout=10)  # the resync
            host_transition(host_id=hosts[0].pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="t")
            pushed = socket.recv(timeout=10)  # committed here, pushed by the server process
            assert 'id="pool-asgi-east"' in pushed
            assert '<td class="num in-service">2</td>' in pushed


def test_an_unknown_asgi_server_is_refused_in_one_line() -> None:
    env = dict(os.environ, ASGI_SERVER="gunicorn", DEBUG="1")
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
    assert "ASGI_SERVER='gunicorn' is not one of uvicorn, daphne, granian" in result.stderr.strip().splitlines()[-1]
