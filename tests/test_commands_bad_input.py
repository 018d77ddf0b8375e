"""Bad input on the command line: one clear line (a CommandError), a non-zero exit, no traceback, and
nothing written. The fleet commands, and `simulate` refusing what it cannot run before any shard starts."""

from __future__ import annotations

import io
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from fleet.models import Host, Pool
from simulation.management.commands import simulate
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent
DEEP_JSON = '{"pools": ' + "[" * 50_000 + "]" * 50_000 + "}"
SMALL = ["--hosts", "40", "--pools", "1", "--hosts-per-domain", "10", "--days", "1", "--lanes", "1"]


def refusal(command: str, *args: str) -> tuple[str, str]:
    """The CommandError's message (one line) and what the command wrote on stderr before it."""
    err = StringIO()
    with pytest.raises(CommandError) as refused:
        call_command(command, *args, stdout=StringIO(), stderr=err)
    message = str(refused.value)
    assert "\n" not in message
    return message, err.getvalue()


# fleet_apply ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"pools: [\xff\xfe]\n", "document: not UTF-8 text"),
        (DEEP_JSON.encode(), "document: nested too deeply to read"),
        (b"version: 2024-13-45\n", "document: a value cannot be read: month must be in 1..12"),
        (b"version: " + b"9" * 5000 + b"\n", "document: a value cannot be read: Exceeds the limit (4300 digits)"),
    ],
)
def test_fleet_apply_reports_a_file_it_cannot_read_as_one_error_on_the_document(tmp_path: Path, content, words) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_bytes(content)

    message, err = refusal("fleet_apply", str(path))

    assert message == f"1 errors in {path}; nothing was written"
    assert f"error: {words}" in err
    assert not Pool.objects.exists()


def test_fleet_apply_reads_standard_input_as_bytes_and_says_when_they_are_not_utf8(monkeypatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"pools: [\xff]\n"), encoding="utf-8"))

    message, err = refusal("fleet_apply", "-", "--dry-run")

    assert message == "1 errors in -; nothing was written"
    assert "error: document: not UTF-8 text" in err


def test_fleet_apply_of_a_non_utf8_file_exits_1_with_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_bytes(b"pools: [\xff]\n")

    done = subprocess.run(
        [sys.executable, "manage.py", "fleet_apply", "-", "--dry-run"],
        cwd=ROOT, input=path.read_bytes(), capture_output=True, check=False, timeout=120,
    )  # fmt: skip

    assert done.returncode == 1
    assert b"Traceback" not in done.stderr
    assert b"not UTF-8 text" in done.stderr


# fleet_import_csv ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "words"),
    [
        ("\u00b2", "line 2: gpus: expected a whole number, got a string"),
        ("9" * 5000, "line 2: gpus: not a GPU count (5000 digits)"),
    ],
)
def test_a_csv_gpu_count_that_is_not_a_short_run_of_ascii_digits_is_an_error_on_its_line(
    tmp_path: Path, gpus, words
) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1)
    path = tmp_path / "hosts.csv"
    path.write_text(f"hostname,domain,sku,gpus\ncsv-h1,{pool.domains.get().name},h100,{gpus}\n")

    message, err = refusal("fleet_import_csv", str(path), "--pool", pool.name, "--dry-run")

    assert message == f"1 errors in {path}; nothing was written"
    assert f"error: {words}" in err


def test_a_csv_field_over_the_csv_limit_is_an_error_on_its_line_and_the_other_lines_are_still_read(
    tmp_path: Path,
) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1)
    domain = pool.domains.get().name
    path = tmp_path / "hosts.csv"
    path.write_text(f"hostname,domain,sku\ncsv-h1,{domain},{'x' * 140_000}\ncsv-h2,{domain},h100,extra\n")

    message, err = refusal("fleet_import_csv", str(path), "--pool", pool.name, "--dry-run")

    assert message == f"2 errors in {path}; nothing was written"
    assert "error: line 2: field larger than field limit (131072)" in err
    assert "error: line 3: more values than columns" in err
    assert not Host.objects.filter(hostname__startswith="csv-").exists()


def test_a_csv_header_over_the_csv_limit_is_an_error_on_line_1(tmp_path: Path) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1)
    path = tmp_path / "hosts.csv"
    path.write_text("hostname," + "x" * 140_000 + "\n")

    _, err = refusal("fleet_import_csv", str(path), "--pool", pool.name, "--dry-run")

    assert "error: line 1: field larger than field limit (131072)" in err


# fleet_export --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "reason"), [("missing/dir/fleet.yaml", "No such file or directory"), ("", "Is a directory")]
)
def test_fleet_export_to_a_place_it_cannot_write_is_one_line(tmp_path: Path, where: str, reason: str) -> None:
    output = tmp_path / where

    message, _ = refusal("fleet_export", "--output", str(output))

    assert message == f"--output: cannot write {output}: {reason}"


# simulate ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--drain-minutes", "inf", "--drain-minutes: drain minutes must be a number from 0 to 10,080 minutes."),
        ("--drain-minutes", "1e307", "--drain-minutes: drain minutes must be a number from 0 to 10,080 minutes."),
        ("--verify-minutes", "nan", "--verify-minutes: verify minutes must be a number from 0 to 10,080 minutes."),
        ("--days", "nan", "--days: days must be a number of at least 0.01 day."),
        ("--tick-minutes", "nan", "--tick-minutes: tick minutes must be a number from 0.1 to 1,440 minutes."),
        ("--cycle-slo-hours", "nan", "--cycle-slo-hours: cycle slo hours must be a number from 0.1 to 8,784 hours."),
        ("--seed", str(2**31), "--seed: seed must be a number from 0 to 2,147,483,647."),
        ("--job-hosts-max", "9" * 30, "--job-hosts-max: job hosts max must be a number from 1 to 200,000 hosts."),
    ],
)
def test_simulate_refuses_a_knob_that_is_not_finite_or_past_its_bound_in_one_line_before_any_shard(
    monkeypatch, option, value, words
) -> None:
    monkeypatch.setattr(simulate, "scratch_databases", lambda *a, **k: pytest.fail("a shard was to start"))

    message, _ = refusal("simulate", *SMALL, option, value)

    assert message == words


def test_simulate_advise_with_a_nan_slo_names_the_slo_in_one_line(monkeypatch) -> None:
    monkeypatch.setattr(simulate, "scratch_databases", lambda *a, **k: pytest.fail("a shard was to start"))

    message, _ = refusal("simulate", "--advise", "--hosts", "100", "--cycle-slo-hours", "nan")

    assert message == "cycle slo hours: cycle slo hours must be a number from 0.1 to 8,784 hours."


def test_simulate_refuses_an_out_that_is_a_file_before_any_shard_starts(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(simulate, "scratch_databases", lambda *a, **k: pytest.fail("a shard was to start"))
    taken = tmp_path / "report"
    taken.write_text("")

    message, _ = refusal("simulate", *SMALL, "--out", str(taken))

    assert message == f"--out: cannot use {taken}: File exists"


def test_a_failed_shard_is_one_line_naming_the_shard_and_its_own_error(tmp_path: Path, monkeypatch) -> None:
    # A lane whose database cannot be reached: the shard's process starts, then fails at once.
    monkeypatch.setattr(simulate, "scratch_databases", lambda *a, **k: ["postgresql://nobody@127.0.0.1:1/nowhere"])
    monkeypatch.setattr(simulate, "scratch_databases_drop", lambda urls: None)

    message, _ = refusal("simulate", *SMALL, "--policies", "rolling", "--out", str(tmp_path / "out"))

    assert message.startswith("simulate: the rolling shard (rolling, pools 0) failed with exit ")
    assert message.endswith(
        ": CommandError: database 'nowhere' is not a simulation scratch database (its name must "
        "end in _sim); `manage.py simulate` creates one for you"
    )  # the shard's last line
    assert "\n" not in message
    assert not list((tmp_path / "out").iterdir())  # no report


def test_simulate_on_a_database_name_too_long_for_its_lanes_is_one_line_and_makes_no_lane(monkeypatch) -> None:
    from types import SimpleNamespace

    from django.conf import settings
    from django.db import connection

    from simulation import runner

    # PostgreSQL cuts names at 63 bytes: the lanes of two runs, or two lanes of one, would collide.
    long_name = "opsplanner_" + "x" * 45
    database = {**settings.DATABASES["default"], "NAME": long_name}
    monkeypatch.setattr(runner, "settings", SimpleNamespace(DATABASES={"default": database}, VAR_DIR=settings.VAR_DIR))
    with pytest.raises(runner.ScratchLaneError) as refused:
        runner.scratch_databases(2, tag="_clirun4194304")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_database WHERE datname LIKE %s", [long_name + "%"])
        assert cursor.fetchone() == (0,)

    monkeypatch.setattr(simulate, "scratch_databases", lambda *a, **k: runner.scratch_databases(*a, **k))
    message, _ = refusal("simulate", *SMALL, "--policies", "rolling")

    assert "would be 76 bytes, PostgreSQL keeps 63 (a name of at most 43 bytes leaves room)" in str(refused.value)
    assert message.startswith(
        f"simulate: the database name '{long_name}' is too long for the simulator's scratch lanes: "
    )
    assert "_clirun" in message
    assert "PostgreSQL keeps 63" in message
