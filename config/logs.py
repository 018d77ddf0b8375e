"""Structured logs: one JSON object per line, for log shippers (selected by LOG_FORMAT=json).

Each line has `time` (UTC, ISO 8601 with milliseconds), `level`, `logger`, `message` and `pid`,
then every field the call passed in `extra={...}` (operation_id, host_id, pool_id, task_id,
work_item_id, …) as a top-level key, and `exception` / `stack` when present. Values JSON cannot
hold are written as their text. This module imports nothing from Django models: the logging
configuration loads it before the apps are ready.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from typing import Any

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD_ATTRIBUTES = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
_BASE_KEYS = ("time", "level", "logger", "message", "pid")


def _jsonable(value: Any) -> Any:
    """Values json.dumps writes as valid JSON (no NaN, no objects it cannot encode)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(item) for item in value]
    method, path = getattr(value, "method", None), getattr(value, "path", None)
    if isinstance(method, str) and isinstance(path, str):  # an HttpRequest (django.request passes one)
        return {"method": method, "path": path}
    return str(value)


class JsonFormatter(logging.Formatter):
    """A logging formatter that writes one JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        created = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
        payload: dict[str, Any] = {
            "time": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for key, value in record.__dict__.items():
            if key in _STANDARD_ATTRIBUTES or key.startswith("_"):
                continue
            # An extra named like a base key does not overwrite it; it is kept beside it.
            payload[f"extra_{key}" if key in _BASE_KEYS else key] = _jsonable(value)
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            payload["exception"] = record.exc_text
        if record.stack_info:
            payload["stack"] = self.formatStack(record.stack_info)
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
