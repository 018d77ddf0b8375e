"""The simplest way in: a CSV of hosts for one pool (columns hostname, domain, sku, gpus, labels as
`k=v;k=v`), turned into the fleet file's host rows and applied by the same plan and apply (creates
and changes, never removes: re-importing the same file changes nothing). Every error names its line."""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from django.db import transaction

from fleet.fleetfile.apply import fleet_apply, pools_lock
from fleet.fleetfile.plan import FleetPlan
from fleet.fleetfile.schema import FleetFileInvalid, Problem
from fleet.fleetfile.sources import hosts_spec
from fleet.models import Pool
from opsplanner.events import Actor

COLUMNS = ("hostname", "domain", "sku", "gpus", "labels")
REQUIRED = ("hostname", "domain", "sku")
ROW_PLACE = re.compile(r"^hosts\[(\d+)\]\.?")
LINE = re.compile(r"^line (\d+)")
FIELD_COLUMN = {"gpu_count": "gpus"}
# ASCII digits only ("²".isdigit() is true too), few enough for int() and the fleet file's range check.
GPUS = re.compile(r"[0-9]{1,10}")


def _labels(text: str, line: int, problems: list[Problem]) -> dict[str, Any]:
    labels: dict[str, Any] = {}
    for pair in filter(None, (part.strip() for part in text.split(";"))):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            problems.append(Problem(f"line {line}: labels", f"{pair!r} is not key=value"))
            continue
        labels[key.strip()] = value.strip()
    return labels


def _gpus(text: str, line: int, problems: list[Problem]) -> dict[str, Any]:
    """The row's gpu_count: a number for the fleet file's range check, else the text (which it refuses
    as not a whole number); too many digits for any count is a problem here."""
    if GPUS.fullmatch(text):
        return {"gpu_count": int(text)}
    if text.isascii() and text.isdigit():
        problems.append(Problem(f"line {line}: gpus", f"not a GPU count ({len(text)} digits)"))
        return {}
    return {"gpu_count": text}


def csv_host_rows(text: str, *, pool: str) -> tuple[list[dict[str, Any]], list[int], list[Problem]]:
    """The rows (the fleet file's host fields), the CSV line of each, and the problems of the values
    the fleet file does not see (labels, extra values) by line; FleetFileInvalid for a wrong header."""
    reader = csv.DictReader(io.StringIO(text))
    try:
        header = [name.strip() for name in reader.fieldnames or []]
    except csv.Error as error:  # a field over the csv module's limit (131,072 characters)
        raise FleetFileInvalid([Problem("line 1", str(error))]) from None
    missing = [name for name in REQUIRED if name not in header]
    unknown = [name for name in header if name not in COLUMNS]
    problems = [Problem("line 1", f"missing column {name}") for name in missing]
    problems += [Problem("line 1", f"unknown column {name!r} (known: {', '.join(COLUMNS)})") for name in unknown]
    if problems:
        raise FleetFileInvalid(problems)
    reader.fieldnames = header
    rows, lines = [], []
    while True:
        try:
            record = next(reader)
        except StopIteration:
            break
        except csv.Error as error:  # this line only: the reader goes on with the next one
            problems.append(Problem(f"line {reader.reader.line_num}", str(error)))
            continue
        line = reader.line_num
        if None in record:
            problems.append(Problem(f"line {line}", "more values than columns"))
            continue
        values = {key: (value or "").strip() for key, value in record.items()}
        row: dict[str, Any] = {"hostname": values["hostname"], "pool": pool, "domain": values["domain"]}
        row["sku"] = values["sku"]
        row.update(_gpus(values.get("gpus") or "0", line, problems))
        row["labels"] = _labels(values.get("labels", ""), line, problems)
        rows.append(row)
        lines.append(line)
    return rows, lines, problems


def _by_line(invalid: FleetFileInvalid, lines: list[int]) -> FleetFileInvalid:
    """hosts[3].domain -> line 5: domain (the CSV's names for the fleet file's fields)."""
    problems = []
    for problem in invalid.problems:
        match = ROW_PLACE.match(problem.place)
        if match is None:
            problems.append(problem)
            continue
        field = problem.place[match.end() :]
        field = FIELD_COLUMN.get(field, field)
        place = f"line {lines[int(match.group(1))]}" + (f": {field}" if field else "")
        problems.append(Problem(place, problem.message))
    return FleetFileInvalid(problems)


@transaction.atomic
def csv_import(*, text: str, pool: str, dry_run: bool = False, actor: Actor = None, reason: str = "") -> FleetPlan:
    """Plan and apply the CSV's hosts in pool (one transaction); FleetFileInvalid names each line."""
    pools_lock()  # before hosts_spec reads the pool it declares as it is live
    if not Pool.objects.filter(name=pool).exists():
        raise FleetFileInvalid([Problem("--pool", f"no pool {pool!r}")])
    rows, lines, problems = csv_host_rows(text, pool=pool)
    if not rows and not problems:
        raise FleetFileInvalid([Problem("file", "no hosts")])
    try:
        spec = hosts_spec(rows)
    except FleetFileInvalid as invalid:
        problems += _by_line(invalid, lines).problems
    if problems:
        raise FleetFileInvalid(sorted(problems, key=_line_order))
    try:
        return fleet_apply(spec=spec, dry_run=dry_run, actor=actor, reason=reason or "imported from CSV")
    except FleetFileInvalid as invalid:
        raise _by_line(invalid, lines) from None


def _line_order(problem: Problem) -> tuple[int, str]:
    match = LINE.match(problem.place)
    return (int(match.group(1)) if match else 0, problem.place)
