"""`make test` stops at once, naming the missing server and how to start it; never a SQLite fallback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from config.preflight import ServiceUnavailable, require_postgres, require_redis
from tests.processes import ROOT, free_port


def test_an_unreachable_postgresql_is_named_with_how_to_start_it() -> None:
    port = free_port()
    with pytest.raises(ServiceUnavailable, match=rf"PostgreSQL at 127.0.0.1:{port} is unreachable") as caught:
        require_postgres(f"postgresql://postgres@127.0.0.1:{port}/opsplanner")
    assert "pg_ctlcluster --skip-systemctl-redirect" in str(caught.value)


def test_an_unreachable_redis_is_named_with_how_to_start_it() -> None:
    port = free_port()
    with pytest.raises(ServiceUnavailable, match=rf"Redis at redis://127.0.0.1:{port}/0 is unreachable") as caught:
        require_redis(f"redis://127.0.0.1:{port}/0")
    assert "redis-server --daemonize yes" in str(caught.value)


def test_a_sqlite_url_is_refused_for_the_tests() -> None:
    with pytest.raises(ServiceUnavailable, match="the tests run against PostgreSQL only"):
        require_postgres("sqlite:///var/x.sqlite3")


def test_the_check_script_exits_non_zero_with_the_message() -> None:
    env = dict(os.environ, DATABASE_URL=f"postgresql://postgres@127.0.0.1:{free_port()}/opsplanner")
    result = subprocess.run(
        [sys.executable, "scripts/check_services.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "make test: PostgreSQL at 127.0.0.1:" in result.stderr


def test_pytest_itself_refuses_to_run_on_sqlite(tmp_path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env.update({"DEBUG": "1", "OPSPLANNER_VAR_DIR": str(tmp_path)})
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_versions.py", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "the tests need PostgreSQL" in result.stdout + result.stderr
