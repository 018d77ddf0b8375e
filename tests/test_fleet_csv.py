"""fleet_import_csv: hosts of one pool from a CSV, applied through the fleet file's plan and apply
(re-importing changes nothing; every error names its line); and the fleet file's pool adapters."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from fleet.fleetfile import fleet_apply, parse_fleet_file
from fleet.fleetfile.export import fleet_export_document
from fleet.fleetfile.schema import FleetFileInvalid, fleet_spec_from_document
from fleet.models import Host, Pool
from opsplanner.models import Event
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db

CSV = """hostname,domain,sku,gpus,labels
csv-h1,rack-0001,h100,8,row=3;switch=sw-1
csv-h2,rack-0002,h100,8,
"""


def run(tmp_path: Path, text: str, *args: str) -> str:
    path = tmp_path / "hosts.csv"
    path.write_text(text)
    out = StringIO()
    call_command("fleet_import_csv", str(path), *args, stdout=out)
    return out.getvalue()


def test_a_csv_import_creates_its_hosts_and_importing_it_again_changes_nothing(tmp_path: Path) -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=1)

    out = run(tmp_path, CSV, "--pool", pool.name)
    events = Event.objects.count()
    again = run(tmp_path, CSV, "--pool", pool.name)

    assert "+ host csv-h1" in out
    assert "Applied 2 changes." in out
    host = Host.objects.get(hostname="csv-h1")
    assert (host.pool_id, host.domain.name, host.gpu_count, host.labels) == (
        pool.pk, "rack-0001", 8, {"row": "3", "switch": "sw-1"}
    )  # fmt: skip
    assert "no changes" in again
    assert Event.objects.count() == events


def test_a_csv_dry_run_prints_the_plan_and_writes_nothing(tmp_path: Path) -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=1)

    out = run(tmp_path, CSV, "--pool", pool.name, "--dry-run")

    assert "Plan (dry run): 2 to create" in out
    assert not Host.objects.filter(hostname__startswith="csv-").exists()


def test_every_error_of_a_csv_names_its_line_and_nothing_is_written(tmp_path: Path) -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=1)
    bad = CSV + "csv-h3,rack-99,h100,8,\ncsv-h4,rack-0001,h100,99,row\n"

    (tmp_path / "hosts.csv").write_text(bad)
    err = StringIO()

    with pytest.raises(CommandError, match="3 errors"):
        call_command("fleet_import_csv", str(tmp_path / "hosts.csv"), "--pool", pool.name, stderr=err)

    assert err.getvalue().splitlines() == [
        f"error: line 4: domain: no domain 'rack-99' in pool {pool.name}",
        "error: line 5: gpus: must be between 0 and 64, not 99",
        "error: line 5: labels: 'row' is not key=value",
    ]
    assert not Host.objects.filter(hostname__startswith="csv-").exists()


def test_a_csv_for_a_pool_that_does_not_exist_is_one_error(tmp_path: Path) -> None:
    err = StringIO()
    (tmp_path / "hosts.csv").write_text(CSV)

    with pytest.raises(CommandError, match="1 errors"):
        call_command("fleet_import_csv", str(tmp_path / "hosts.csv"), "--pool", "nowhere", stderr=err)
    assert err.getvalue().strip() == "error: --pool: no pool 'nowhere'"


# The fleet file's pool adapters ------------------------------------------------------------------

POOL = {"name": "p1", "workload_class": "web", "planned_buffer": 1, "failure_buffer": 1, "domains": ["rack-1"]}


def test_the_fleet_file_sets_a_pools_executor_and_drainer_and_exports_them_back() -> None:
    plan = fleet_apply(spec=fleet_spec_from_document({"pools": [{**POOL, "executor": "agent", "drainer": "slurm"}]}))
    assert plan.applied
    assert Pool.objects.filter(name="p1", executor="agent", drainer="slurm").exists()

    changed = fleet_apply(spec=fleet_spec_from_document({"pools": [{**POOL, "drainer": "kubernetes"}]}))

    assert [c.line() for c in changed.changes] == [
        "~ pool p1: executor agent -> simulated, drainer slurm -> kubernetes"
    ]
    exported = fleet_export_document(pool="p1")
    assert (exported["pools"][0]["executor"], exported["pools"][0]["drainer"]) == ("simulated", "kubernetes")
    assert fleet_apply(spec=fleet_spec_from_document(exported)).changes == []


def test_a_drainer_that_is_not_one_is_an_error_at_its_place() -> None:
    with pytest.raises(FleetFileInvalid) as invalid:
        parse_fleet_file('{"pools": [' + str({**POOL, "drainer": "ssh"}).replace("'", '"') + "]}")

    assert [str(p) for p in invalid.value.problems] == [
        "pools[0].drainer: 'ssh' is not one of simulated, external, slurm, kubernetes"
    ]
