"""LOG_FORMAT=json: one JSON object per line, with the ids a call passed in `extra`."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from config.logs import JsonFormatter

ROOT = Path(__file__).resolve().parent.parent
IDS = {"operation_id": 7, "host_id": 11, "pool_id": 3, "task_id": 42, "work_item_id": 99}


def _strict(text: str) -> dict:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def captured():
    """A logger whose records go through the JSON formatter into a string buffer."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tests.structured")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, stream
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


def lines(stream: io.StringIO) -> list[dict]:
    text = stream.getvalue()
    assert text.endswith("\n")
    return [_strict(line) for line in text.splitlines()]


def test_a_record_is_one_json_object_with_the_base_fields_and_the_extra_ids(captured) -> None:
    logger, stream = captured

    logger.warning("tick of pool %s rolled back: %s", 3, "2 of 3 tasks were not pending", extra=IDS)

    [entry] = lines(stream)
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "tests.structured"
    assert entry["message"] == "tick of pool 3 rolled back: 2 of 3 tasks were not pending"
    assert entry["pid"] == os.getpid()
    assert {key: entry[key] for key in IDS} == IDS
    assert entry["time"].endswith("Z")
    logged_at = dt.datetime.fromisoformat(entry["time"].replace("Z", "+00:00"))
    assert abs(logged_at - dt.datetime.now(dt.UTC)) < dt.timedelta(seconds=60)
    assert not {"msg", "args", "levelno", "pathname", "exc_info"} & set(entry)


def test_newlines_and_exceptions_stay_on_one_line(captured) -> None:
    logger, stream = captured

    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        logger.exception("first line\nsecond line", extra={"task_id": 5})

    text = stream.getvalue()
    assert text.count("\n") == 1
    [entry] = lines(stream)
    assert entry["message"] == "first line\nsecond line"
    assert entry["level"] == "ERROR"
    assert entry["task_id"] == 5
    assert "Traceback" in entry["exception"]
    assert "ValueError: bad" in entry["exception"]


def test_values_json_cannot_hold_are_written_as_text(captured) -> None:
    logger, stream = captured

    class Thing:
        def __str__(self) -> str:
            return "a thing"

    when = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
    logger.info(
        "odd extras",
        extra={"thing": Thing(), "at": when, "ratio": float("nan"), "ids": {3, 1}, "nested": {"k": (1, 2)}},
    )

    [entry] = lines(stream)
    assert entry["thing"] == "a thing"
    assert entry["at"] == "2030-01-01T12:00:00+00:00"
    assert entry["ratio"] == "nan"
    assert sorted(entry["ids"]) == [1, 3]
    assert entry["nested"] == {"k": [1, 2]}


def test_an_extra_named_like_a_base_field_does_not_replace_it(captured) -> None:
    logger, stream = captured

    logger.info("hello", extra={"time": "yesterday", "level": "low", "pool_id": 1})

    [entry] = lines(stream)
    assert entry["level"] == "INFO"
    assert entry["extra_time"] == "yesterday"
    assert entry["extra_level"] == "low"
    assert entry["time"].endswith("Z")


def test_a_request_passed_by_django_is_written_as_method_and_path(captured, rf) -> None:
    logger, stream = captured

    logger.error("Not Found: /x", extra={"status_code": 404, "request": rf.get("/x?y=1")})

    [entry] = lines(stream)
    assert entry["status_code"] == 404
    assert entry["request"] == {"method": "GET", "path": "/x"}


# --- the LOG_FORMAT setting ---------------------------------------------------------------------------
TICK_LOG = "logging.getLogger('opsplanner.services.tick.run').warning('tick rolled back', extra={'pool_id': 3})"


def _log_in_subprocess(env: dict[str, str], tmp_path: Path, log: str = TICK_LOG) -> subprocess.CompletedProcess[str]:
    clean = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "REDIS_URL", "LOG_FORMAT"}}
    clean.update({"OPSPLANNER_VAR_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "config.settings", **env})
    code = f"import django, logging; django.setup(); {log}"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60, check=False
    )


def test_log_format_json_makes_the_console_write_json(tmp_path: Path) -> None:
    result = _log_in_subprocess({"DEBUG": "1", "LOG_FORMAT": "json"}, tmp_path)

    assert result.returncode == 0, result.stderr
    entry = _strict(result.stderr.strip().splitlines()[-1])
    assert entry["message"] == "tick rolled back"
    assert entry["logger"] == "opsplanner.services.tick.run"
    assert entry["pool_id"] == 3


def test_djangos_own_records_are_written_once_and_as_json_too(tmp_path: Path) -> None:
    log = "logging.getLogger('django.request').warning('Not Found: /x'); logging.getLogger('django.server').info('GET')"

    result = _log_in_subprocess({"DEBUG": "1", "LOG_FORMAT": "json"}, tmp_path, log)

    assert result.returncode == 0, result.stderr
    entries = [_strict(line) for line in result.stderr.strip().splitlines()]
    assert [entry["logger"] for entry in entries] == ["django.request", "django.server"]


def test_json_is_the_default_without_debug_and_text_with_it(tmp_path: Path) -> None:
    production = _log_in_subprocess({"DEBUG": "0", "SECRET_KEY": "a-real-secret-for-this-test"}, tmp_path)
    development = _log_in_subprocess({"DEBUG": "1"}, tmp_path)

    assert production.returncode == 0, production.stderr
    assert _strict(production.stderr.strip().splitlines()[-1])["level"] == "WARNING"
    assert development.returncode == 0, development.stderr
    last = development.stderr.strip().splitlines()[-1]
    assert last.endswith("WARNING opsplanner.services.tick.run tick rolled back")


def test_an_unknown_log_format_stops_the_app_with_the_variable_named(tmp_path: Path) -> None:
    result = _log_in_subprocess({"DEBUG": "1", "LOG_FORMAT": "xml"}, tmp_path)

    assert result.returncode != 0
    assert "LOG_FORMAT='xml' is not one of json, text" in result.stderr


def test_a_short_metrics_token_stops_the_app(tmp_path: Path) -> None:
    result = _log_in_subprocess({"DEBUG": "1", "METRICS_TOKEN": "short"}, tmp_path)

    assert result.returncode != 0
    assert "METRICS_TOKEN is shorter than 16 characters" in result.stderr


@pytest.mark.django_db
def test_the_core_logs_submissions_ticks_and_reports_with_their_ids(caplog) -> None:
    from opsplanner.services.operations import operation_submit
    from opsplanner.services.tick import pool_tick
    from opsplanner.services.work_items import work_item_report, work_items_claim
    from tests.builders import make_fleet

    pool, _hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2)
    with caplog.at_level(logging.INFO):
        operation = operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="kernel", drainer="external")
        pool_tick(pool_id=pool.pk, kick=False)
        item = work_items_claim(worker="drainer-1", adapter="external", limit=1)[0]
        work_item_report(item_id=item.pk, worker="drainer-1", key="k-1", outcome="done")

    submitted = next(r for r in caplog.records if r.getMessage() == "operation submitted")
    assert submitted.operation_id == operation.pk
    assert submitted.hosts == 2
    ticked = next(r for r in caplog.records if r.getMessage() == f"pool {pool.pk} ticked")
    assert ticked.pool_id == pool.pk
    assert ticked.counts["task_draining"] == 2
    reported = next(r for r in caplog.records if r.getMessage() == "work item reported done")
    assert (reported.work_item_id, reported.host_id, reported.pool_id) == (item.pk, item.host_id, pool.pk)
    line = _strict(JsonFormatter().format(reported))
    assert line["work_item_id"] == item.pk
    assert line["task_id"] == item.host_task_id
