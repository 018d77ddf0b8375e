"""The configuration readers of the adapters: one place for each rule of their TOML files.

Every reader raises ConfigError with one line naming the table and the key (the program prefixes
its name, and the SSH executor the file), never a traceback. Two spellings of a key are in use
and both are kept, because operators and the docs know them: the `[api]` table and the drainers'
tables say "api.url ...", `setting()` (the SSH executor's and the agent's own tables) says
"[executor]: `concurrency` ...". The agent alone words a non-http URL its documented way."""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HTTP_SCHEMES = ("http://", "https://")
TOKEN_REQUIRED = "api.token (or api.token_file) is required: an executor token from `manage.py token_create`"
_REQUIRED: Any = object()  # `setting()` without a default: the key must be there


class ConfigError(ValueError):
    """The configuration cannot be used; the message is one line naming the table and the key."""


def read_toml(path: str | Path) -> dict[str, Any]:
    """The parsed file; ConfigError when it cannot be read or is not TOML."""
    try:
        return tomllib.loads(Path(path).read_text())
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path} is not valid TOML: {error}") from None


def table(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The table `[name]`, empty when absent."""
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"[{name}] must be a table")
    return value


def finite(value: object) -> bool:
    """A real number: not a boolean, and not the `inf` or `nan` that TOML can write."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def number(table: Mapping[str, Any], key: str, default: float, *, section: str, minimum: float = 0.1) -> float:
    """A finite number of at least `minimum` (booleans are not numbers)."""
    value = table.get(key, default)
    if not finite(value) or value < minimum:
        raise ConfigError(f"{section}.{key} must be a number of at least {minimum}, not {value!r}")
    return float(value)


def setting(
    table: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any = _REQUIRED
) -> Any:
    """`table[key]` of the given type(s), or `default`; required when no default is given.
    `where` names the table as the message should: "[executor]", "[hosts.gpu-1]"."""
    if key not in table:
        if default is _REQUIRED:
            raise ConfigError(f"{where}: `{key}` is required")
        return default
    value = table[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise ConfigError(f"{where}: `{key}` must be {names}, not {value!r}")
    return value


def positive(table: Mapping[str, Any], key: str, where: str, default: float) -> float:
    """`table[key]`, a finite number above 0 (a timeout, a pause), or `default`."""
    value = table.get(key, default)
    if not finite(value) or value <= 0:
        raise ConfigError(f"{where}: `{key}` must be a positive number, not {value!r}")
    return float(value)


def path_setting(table: Mapping[str, Any], key: str, where: str, base: Path) -> Path:
    """A required path; a relative one is relative to `base` (the configuration file's folder)."""
    return (base / Path(setting(table, key, str, where)).expanduser()).resolve()


def api_url(api: Mapping[str, Any]) -> str:
    url = api.get("url")
    if not isinstance(url, str) or not url.startswith(HTTP_SCHEMES):
        raise ConfigError(f"api.url must be an http:// or https:// URL, not {url!r}")
    return url


def api_token(api: Mapping[str, Any], base: Path) -> str:
    """`api.token`, else the text of `api.token_file` (relative to `base`)."""
    token: object  # the file's text, or whatever the config holds (checked below)
    if "token" in api:
        token = api["token"]
    elif "token_file" in api:
        path = base / Path(str(api["token_file"])).expanduser()
        try:
            token = path.read_text().strip()
        except OSError as error:
            raise ConfigError(f"api.token_file {path}: {error.strerror or error}") from None
        if not token:
            raise ConfigError(f"api.token_file {path} is empty: {TOKEN_REQUIRED}")
    else:
        raise ConfigError(TOKEN_REQUIRED)
    if not isinstance(token, str) or not token:
        raise ConfigError(f"api.token must be a non-empty string: {TOKEN_REQUIRED}")
    return token


@dataclass(frozen=True)
class ApiSettings:
    """The `[api]` table every adapter has: where the API is, the token, who we are."""

    url: str
    token: str
    worker: str
    timeout_s: float


def api_settings(doc: Mapping[str, Any], *, base: Path, default_worker: str) -> ApiSettings:
    """The `[api]` table: `url` (http or https), `token` or `token_file`, `worker`, `timeout_s`."""
    api = table(doc, "api")
    url = api_url(api)
    worker = api.get("worker") or default_worker  # empty: the default
    if not isinstance(worker, str):
        raise ConfigError(f"api.worker must be a non-empty string, not {worker!r}")
    return ApiSettings(
        url=url,
        token=api_token(api, base),
        worker=worker,
        timeout_s=number(api, "timeout_s", 30, section="api"),
    )
