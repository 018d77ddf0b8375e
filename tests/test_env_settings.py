"""Settings come from the environment through typed helpers that fail loudly on bad values."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from config.env import (
    EnvError,
    env_bool,
    env_int,
    env_list,
    env_redis_url,
    env_str,
    parse_database_url,
)

ROOT = Path(__file__).resolve().parent.parent


def test_env_bool_reads_the_usual_spellings() -> None:
    assert env_bool("X", False, environ={"X": "yes"}) is True
    assert env_bool("X", True, environ={"X": "0"}) is False
    assert env_bool("X", True, environ={}) is True


def test_env_bool_names_the_variable_when_the_value_is_not_a_boolean() -> None:
    with pytest.raises(EnvError, match=r"DEBUG='ture' is not a boolean"):
        env_bool("DEBUG", False, environ={"DEBUG": "ture"})


def test_env_int_refuses_words_and_values_out_of_range() -> None:
    with pytest.raises(EnvError, match="WORKERS='many' is not a whole number"):
        env_int("WORKERS", 1, environ={"WORKERS": "many"})
    with pytest.raises(EnvError, match="WORKERS=0 is below the minimum of 1"):
        env_int("WORKERS", 1, minimum=1, environ={"WORKERS": "0"})
    with pytest.raises(EnvError, match="WORKERS=99 is above the maximum of 8"):
        env_int("WORKERS", 1, maximum=8, environ={"WORKERS": "99"})
    assert env_int("WORKERS", 3, environ={}) == 3


def test_env_str_without_default_insists_on_a_value() -> None:
    with pytest.raises(EnvError, match="SECRET_KEY must be set"):
        env_str("SECRET_KEY", environ={"SECRET_KEY": "  "})


def test_env_list_refuses_empty_entries() -> None:
    assert env_list("HOSTS", [], environ={"HOSTS": "a.example, b.example"}) == ["a.example", "b.example"]
    with pytest.raises(EnvError, match="has an empty entry"):
        env_list("HOSTS", [], environ={"HOSTS": "a.example,,b"})


def test_database_url_for_postgresql_is_split_into_its_parts() -> None:
    config = parse_database_url("DATABASE_URL", "postgresql://ops:s%40cret@db.internal:6432/fleet?sslmode=require")
    assert config.engine == "django.db.backends.postgresql"
    assert (config.user, config.password, config.host, config.port, config.name) == (
        "ops",
        "s@cret",
        "db.internal",
        "6432",
        "fleet",
    )
    assert dict(config.options) == {"sslmode": "require"}


def test_database_url_for_sqlite_takes_relative_and_absolute_paths() -> None:
    assert parse_database_url("D", "sqlite:///var/x.sqlite3").name == "var/x.sqlite3"
    assert parse_database_url("D", "sqlite:////tmp/x.sqlite3").name == "/tmp/x.sqlite3"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgress://h/db", "unsupported scheme 'postgress'"),
        ("postgresql://h:5432/", "names no database"),
        ("postgresql://h:99999/db", "port is not a number"),
        ("sqlite://host/file", "a sqlite URL has no host"),
        ("sqlite:///", "names no file"),
    ],
)
def test_a_bad_database_url_is_refused_with_the_reason(url: str, message: str) -> None:
    with pytest.raises(EnvError, match=message):
        parse_database_url("DATABASE_URL", url)


def test_a_bad_redis_url_is_refused() -> None:
    with pytest.raises(EnvError, match="use redis://"):
        env_redis_url("REDIS_URL", environ={"REDIS_URL": "http://127.0.0.1:6379"})
    with pytest.raises(EnvError, match="port is not a number"):
        env_redis_url("REDIS_URL", environ={"REDIS_URL": "redis://127.0.0.1:port/0"})
    assert env_redis_url("REDIS_URL", environ={}) is None


def _settings_in_subprocess(
    env: dict[str, str], expression: str, *, drop: frozenset[str] | set[str] = frozenset()
) -> subprocess.CompletedProcess[str]:
    unset = {"DATABASE_URL", "REDIS_URL", "DEBUG", *drop}
    clean = {key: value for key, value in os.environ.items() if key not in unset}
    clean.update(env)
    clean["DJANGO_SETTINGS_MODULE"] = "config.settings"
    code = f"import django; django.setup(); from django.conf import settings; print(repr(({expression})))"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_app_refuses_to_start_without_a_secret_when_debug_is_off(tmp_path: Path) -> None:
    result = _settings_in_subprocess({"DEBUG": "0", "OPSPLANNER_VAR_DIR": str(tmp_path)}, "settings.SECRET_KEY")
    assert result.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in result.stderr


@pytest.mark.parametrize(
    "entry_point",
    [
        ["manage.py", "check"],
        ["-m", "celery", "-A", "config", "worker", "--pool", "solo"],
        ["-m", "uvicorn", "config.asgi:application", "--port", "0"],
    ],
    ids=["manage.py", "celery", "asgi"],
)
def test_every_entry_point_says_a_configuration_mistake_in_one_line(tmp_path: Path, entry_point: list[str]) -> None:
    clean = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "REDIS_URL", "DEBUG"}}
    clean.update({"DEBUG": "0", "OPSPLANNER_VAR_DIR": str(tmp_path)})
    result = subprocess.run(
        [sys.executable, *entry_point], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "configuration error: SECRET_KEY must be set when DEBUG is off (the development key is refused)"
    ]


def test_the_app_refuses_the_development_secret_when_debug_is_off(tmp_path: Path) -> None:
    result = _settings_in_subprocess(
        {"DEBUG": "off", "SECRET_KEY": "opsplanner-development-only-not-secret", "OPSPLANNER_VAR_DIR": str(tmp_path)},
        "settings.SECRET_KEY",
    )
    assert result.returncode != 0
    assert "SECRET_KEY is the development key" in result.stderr


def test_a_typo_in_debug_stops_the_app_with_the_variable_named(tmp_path: Path) -> None:
    result = _settings_in_subprocess({"DEBUG": "ture", "OPSPLANNER_VAR_DIR": str(tmp_path)}, "settings.DEBUG")
    assert result.returncode != 0
    assert "DEBUG='ture' is not a boolean" in result.stderr


def test_without_database_and_redis_urls_the_embedded_default_is_sqlite_wal_and_a_sqlite_broker(
    tmp_path: Path,
) -> None:
    result = _settings_in_subprocess(
        {"DEBUG": "1", "OPSPLANNER_VAR_DIR": str(tmp_path)},
        "settings.DATABASES['default']['ENGINE'], settings.DATABASES['default']['NAME'], "
        "settings.CELERY_BROKER_URL, settings.CHANNEL_LAYERS['default']['BACKEND'], "
        "settings.TIME_ZONE, settings.USE_TZ, settings.CELERY_BROKER_TRANSPORT_OPTIONS['path']",
    )
    assert result.returncode == 0, result.stderr
    engine, name, broker, layer, tz, use_tz, broker_file = ast.literal_eval(result.stdout)
    assert engine == "django.db.backends.sqlite3"
    assert name == str(tmp_path / "opsplanner.sqlite3")
    assert broker == "opsqlite://localhost/"
    assert broker_file == str(tmp_path / "broker.sqlite3")
    assert layer == "channels.layers.InMemoryChannelLayer"
    assert (tz, use_tz) == ("UTC", True)
    assert (tmp_path / "log").is_dir()


def test_with_urls_set_the_production_shape_uses_postgresql_and_redis(tmp_path: Path) -> None:
    result = _settings_in_subprocess(
        {
            "DEBUG": "0",
            "SECRET_KEY": "a-real-secret-for-this-test",
            "DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/opsplanner",
            "REDIS_URL": "redis://127.0.0.1:6379/3",
            "OPSPLANNER_VAR_DIR": str(tmp_path),
        },
        "settings.DATABASES['default']['ENGINE'], settings.CELERY_BROKER_URL, "
        "settings.CHANNEL_LAYERS['default']['BACKEND']",
    )
    assert result.returncode == 0, result.stderr
    assert ast.literal_eval(result.stdout) == (
        "django.db.backends.postgresql",
        "redis://127.0.0.1:6379/3",
        "channels_redis.core.RedisChannelLayer",
    )


@pytest.mark.parametrize(("asgi", "pool"), [("1", {"min_size": 3, "max_size": 3, "timeout": 10}), (None, None)])
def test_the_connection_pool_is_the_web_processes_only_whatever_the_environment_says(
    tmp_path: Path, asgi: str | None, pool: dict | None
) -> None:
    env = {
        "DEBUG": "1",
        "DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/opsplanner",
        "DATABASE_POOL_MAX_SIZE": "3",
        "OPSPLANNER_VAR_DIR": str(tmp_path),
    }
    if asgi:
        env["OPSPLANNER_ASGI"] = asgi
    result = _settings_in_subprocess(
        env, "settings.DATABASES['default']['OPTIONS'].get('pool')", drop={"OPSPLANNER_ASGI"}
    )
    assert result.returncode == 0, result.stderr
    assert ast.literal_eval(result.stdout) == pool


def test_sqlite_connections_run_in_wal_mode(tmp_path: Path) -> None:
    result = _settings_in_subprocess(
        {"DEBUG": "1", "OPSPLANNER_VAR_DIR": str(tmp_path)},
        "__import__('django.db').db.connection.cursor().execute('PRAGMA journal_mode').fetchone()[0]",
    )
    assert result.returncode == 0, result.stderr
    assert ast.literal_eval(result.stdout) == "wal"


@pytest.mark.parametrize(
    ("database", "said"),
    [("opsplanner_no_such_database", 'database "opsplanner_no_such_database" does not exist'), ("x", "refused")],
    ids=["missing database", "no server"],
)
def test_a_command_that_cannot_reach_its_database_says_so_in_one_line(database: str, said: str) -> None:
    port = "5432" if database != "x" else "1"  # nothing listens on port 1
    # Not a web process (a test that imported config.asgi set OPSPLANNER_ASGI here): no connection pool.
    unset = {"DATABASE_URL", "DEBUG", "OPSPLANNER_ASGI"}
    clean = {key: value for key, value in os.environ.items() if key not in unset}
    clean.update({"DEBUG": "1", "DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/{database}"})
    result = subprocess.run(
        [sys.executable, "manage.py", "check_invariants"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"database error: cannot connect to the database 127.0.0.1:{port}/{database}")
    assert said in lines[0]


@pytest.mark.django_db
def test_a_failed_query_keeps_its_traceback() -> None:
    from django.db import OperationalError, connection

    from config.env import database_unreachable_line

    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL statement_timeout = 10")
        with pytest.raises(OperationalError) as failed:
            cursor.execute("SELECT pg_sleep(1)")
    assert database_unreachable_line(failed.value) is None
    assert database_unreachable_line(ValueError("not a database error")) is None
