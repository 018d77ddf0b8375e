"""Typed readers for environment variables that fail loudly on a bad value.

Every setting that comes from the environment goes through one of these helpers, so a typo in a
deployment ("DEBUG=ture", "DATABASE_URL=postgress://...") stops the process at start-up with a
message naming the variable, instead of silently running with a default.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit


class EnvError(ValueError):
    """A variable is set to something we cannot use; the message names it and says why."""


def settings_or_exit() -> None:
    """Load Django's settings now. A configuration mistake stops the process with one line on stderr
    and exit code 1 instead of a traceback from wherever the settings happen to be read first. The
    entry points call it: manage.py, the Celery app (before it reads its configuration) and the
    ASGI application."""
    from django.conf import settings

    try:
        settings.INSTALLED_APPS  # noqa: B018  (reading one setting loads them all)
    except EnvError as error:
        sys.exit(f"configuration error: {error}")


def database_unreachable_line(error: BaseException) -> str | None:
    """The one line to say for `error` if it is Django's failure to connect to its database (a server
    that is down, a database that does not exist, a refused login); None for any other error, whose
    traceback is what helps. Told by where it was raised (the backend's `get_new_connection`), not by
    its message."""
    from django.db import DEFAULT_DB_ALIAS, OperationalError, connections

    if not isinstance(error, OperationalError) or not _raised_in(error, "get_new_connection", "django/db/backends/"):
        return None
    wrapper = connections[DEFAULT_DB_ALIAS]
    said = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    where = wrapper.settings_dict.get("NAME") or "?"
    if wrapper.vendor == "postgresql":
        host, port = wrapper.settings_dict.get("HOST") or "localhost", wrapper.settings_dict.get("PORT") or 5432
        where = f"{host}:{port}/{where}"
    return f"database error: cannot connect to the database {where} (DATABASE_URL): {said}"


def _raised_in(error: BaseException, function: str, path_part: str) -> bool:
    trace = error.__traceback__
    while trace is not None:
        code = trace.tb_frame.f_code
        if code.co_name == function and path_part in code.co_filename.replace("\\", "/"):
            return True
        trace = trace.tb_next
    return False


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_MISSING = object()


def _raw(name: str, environ: Mapping[str, str] | None) -> str | None:
    source = os.environ if environ is None else environ
    value = source.get(name)
    return None if value is None else value.strip()


def env_str(name: str, default: str | None = None, *, environ: Mapping[str, str] | None = None) -> str:
    value = _raw(name, environ)
    if value is None or value == "":
        if default is None:
            raise EnvError(f"{name} must be set (no default in this mode)")
        return default
    return value


def env_optional_str(name: str, *, environ: Mapping[str, str] | None = None) -> str | None:
    value = _raw(name, environ)
    return value or None


def env_bool(name: str, default: bool, *, environ: Mapping[str, str] | None = None) -> bool:
    value = _raw(name, environ)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise EnvError(f"{name}={value!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off")


def env_int(
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    value = _raw(name, environ)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise EnvError(f"{name}={value!r} is not a whole number") from None
    if minimum is not None and number < minimum:
        raise EnvError(f"{name}={number} is below the minimum of {minimum}")
    if maximum is not None and number > maximum:
        raise EnvError(f"{name}={number} is above the maximum of {maximum}")
    return number


def env_list(name: str, default: list[str], *, environ: Mapping[str, str] | None = None) -> list[str]:
    value = _raw(name, environ)
    if value is None or value == "":
        return list(default)
    items = [item.strip() for item in value.split(",")]
    if any(not item for item in items):
        raise EnvError(f"{name}={value!r} has an empty entry; separate values with single commas")
    return items


@dataclass(frozen=True)
class DatabaseConfig:
    """The parts of DATABASE_URL that Django's DATABASES entry needs."""

    engine: str
    name: str
    user: str = ""
    password: str = ""
    host: str = ""
    port: str = ""
    options: tuple[tuple[str, str], ...] = ()

    @property
    def is_sqlite(self) -> bool:
        return self.engine == "django.db.backends.sqlite3"


_POSTGRES_SCHEMES = {"postgres", "postgresql", "pgsql"}


def parse_database_url(name: str, url: str) -> DatabaseConfig:
    """Parse postgres://user:pass@host:port/db?opt=v or sqlite:///relative or sqlite:////absolute."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        # sqlite:///var/db.sqlite3 is relative to the working directory, sqlite:////tmp/x absolute.
        path = unquote(parts.path)
        if parts.netloc:
            raise EnvError(f"{name}={url!r}: a sqlite URL has no host; write sqlite:///path/to/file")
        if path.startswith("/"):
            path = path[1:]
        if not path:
            raise EnvError(f"{name}={url!r}: the sqlite URL names no file")
        return DatabaseConfig(engine="django.db.backends.sqlite3", name=str(Path(path)))
    if scheme in _POSTGRES_SCHEMES:
        database = unquote(parts.path.lstrip("/"))
        if not database:
            raise EnvError(f"{name}={url!r}: the PostgreSQL URL names no database (…/dbname)")
        try:
            port = parts.port
        except ValueError:
            raise EnvError(f"{name}={url!r}: the port is not a number between 0 and 65535") from None
        return DatabaseConfig(
            engine="django.db.backends.postgresql",
            name=database,
            user=unquote(parts.username or ""),
            password=unquote(parts.password or ""),
            host=parts.hostname or "",
            port=str(port or ""),
            options=tuple(parse_qsl(parts.query)),
        )
    raise EnvError(f"{name}={url!r}: unsupported scheme {parts.scheme!r}; use postgresql://… or sqlite:///…")


def env_database(name: str, default: str, *, environ: Mapping[str, str] | None = None) -> DatabaseConfig:
    return parse_database_url(name, env_str(name, default, environ=environ))


def env_redis_url(name: str, *, environ: Mapping[str, str] | None = None) -> str | None:
    """A redis:// or rediss:// URL, or None when unset (the embedded mode)."""
    value = env_optional_str(name, environ=environ)
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in {"redis", "rediss", "unix"}:
        raise EnvError(f"{name}={value!r}: use redis://host:port/db, rediss://… or unix://…")
    if parts.scheme != "unix" and not parts.hostname:
        raise EnvError(f"{name}={value!r}: the Redis URL names no host")
    try:
        _ = parts.port  # urlsplit validates the port lazily
    except ValueError:
        raise EnvError(f"{name}={value!r}: the port is not a number between 0 and 65535") from None
    return value
