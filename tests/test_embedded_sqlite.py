"""The embedded default (SQLite) enforces the same inventory and task-key constraints as PostgreSQL,
and keeps events append-only.

SQLite cannot add a multi-column foreign key to an existing table, so the migration installs
triggers there; this test drives a real SQLite database through the real migrations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
from django.db import IntegrityError, transaction
from fleet.models import Host, InstalledVersion, MaintenanceDomain
from fleet import services
from tests.builders import make_component, make_domain, make_host, make_pool, make_version

host = make_host()
other_rack = make_domain(make_pool())
outcomes = []
def attempt(name, write):
    try:
        with transaction.atomic():
            write()
        outcomes.append(name + ":accepted")
    except IntegrityError as error:
        outcomes.append(name + ":refused")
attempt("host-in-foreign-domain", lambda: Host.objects.create(
    hostname="stray", pool_id=host.pool_id, domain=other_rack, sku="x"))
attempt("move-host", lambda: Host.objects.filter(pk=host.pk).update(domain=other_rack))
attempt("move-domain", lambda: MaintenanceDomain.objects.filter(pk=host.domain_id).update(pool_id=other_rack.pool_id))
bios, kernel = make_component(), make_component()
attempt("wrong-component", lambda: InstalledVersion.objects.create(
    host=host, component=bios, version=make_version(kernel, "6.1")))
attempt("same-pool-ok", lambda: Host.objects.create(
    hostname="fine", pool_id=host.pool_id, domain_id=host.domain_id, sku="x"))
from opsplanner.models import HostTask, Lease, Operation, WorkItem
operation = Operation.objects.create(kind="reboot", reason="keys", scope="hosts", requester="test", priority=100)
task = HostTask.objects.create(operation=operation, host=host, pool_id=host.pool_id, priority=100)
stranger = make_host(make_domain(make_pool()))
attempt("lease-on-another-host", lambda: Lease.objects.create(
    host=stranger, host_task=task, operation=operation, pool_id=host.pool_id))
attempt("item-on-another-host", lambda: WorkItem.objects.create(
    kind="drain", host=stranger, host_task=task, pool_id=host.pool_id, adapter="simulated"))
attempt("move-task-to-another-host", lambda: (
    WorkItem.objects.create(kind="drain", host=host, host_task=task, pool_id=host.pool_id, adapter="simulated"),
    HostTask.objects.filter(pk=task.pk).update(host=stranger)))
attempt("lease-on-its-host-ok", lambda: Lease.objects.create(
    host=host, host_task=task, operation=operation, pool_id=host.pool_id))
from opsplanner.models import Event
event = Event.objects.create(kind="host.state_changed", actor="test", subject_type="fleet.host", subject_id=host.pk)
attempt("change-event", lambda: Event.objects.filter(pk=event.pk).update(reason="rewritten"))
attempt("delete-event", lambda: Event.objects.filter(pk=event.pk).delete())
print(" ".join(outcomes))
print(Host.objects.count())
"""


def test_sqlite_refuses_foreign_domains_other_components_versions_and_work_on_another_host(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "REDIS_URL"}}
    env.update({"DEBUG": "1", "OPSPLANNER_VAR_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "config.settings"})
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert migrate.returncode == 0, migrate.stderr
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    outcomes, host_count = result.stdout.strip().splitlines()[-2:]
    assert outcomes.split() == [
        "host-in-foreign-domain:refused",
        "move-host:refused",
        "move-domain:refused",
        "wrong-component:refused",
        "same-pool-ok:accepted",
        "lease-on-another-host:refused",
        "item-on-another-host:refused",
        "move-task-to-another-host:refused",
        "lease-on-its-host-ok:accepted",
        "change-event:refused",
        "delete-event:refused",
    ]
    assert host_count == "3"


def test_an_embedded_simulation_reuses_its_sqlite_lane_although_events_are_append_only(tmp_path: Path) -> None:
    """Two policies in one lane: the second empties the lane the first filled, events included
    (SQLite empties with DELETE, which the append-only triggers refuse unless the reset lifts them)."""
    env = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "REDIS_URL"}}
    env.update({"DEBUG": "1", "OPSPLANNER_VAR_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "config.settings"})
    result = subprocess.run(
        [sys.executable, "manage.py", "simulate", "--hosts", "100", "--pools", "1", "--hosts-per-domain", "10",
         "--days", "2", "--lanes", "1", "--policies", "trains,rolling", "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    totals = json.loads(result.stdout)["totals"]
    for policy in ("trains", "rolling"):
        assert totals[policy]["ran"], policy
        assert totals[policy]["drains"] > 0, policy
        assert totals[policy]["violations"] == 0, policy
