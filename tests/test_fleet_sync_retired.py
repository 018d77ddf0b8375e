"""A sync never brings back a host retired here that its source still lists (a node left in
slurm.conf): the row is left out, named, and the host stays retired until restored by hand."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.models import Host, HostState, Pool
from fleet.models.hosts import RETIRED
from fleet.services.host_changes import host_restore, host_retire
from fleet.sync import sync_hosts
from opsplanner.models import Event
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db


def _row(pool: Pool, host: Host | None = None, hostname: str = "") -> dict[str, Any]:
    return {
        "hostname": host.hostname if host else hostname,
        "pool": pool.name,
        "domain": host.domain.name if host else "rack-0001",
        "sku": host.sku if host else "h100",
        "gpu_count": host.gpu_count if host else 8,
    }


def _state(hostname: str) -> str:
    return Host.all_objects.get(hostname=hostname).state


def test_a_sync_leaves_a_host_retired_here_retired_and_names_it() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=1)
    retired, kept = hosts[0], hosts[1]
    host_retire(hostname=retired.hostname, reason="failed for good")
    rows = [_row(pool, retired), _row(pool, kept), _row(pool, hostname="new-1")]

    synced = sync_hosts(rows=rows, reason="synced from Slurm")

    assert synced.kept_retired == [retired.hostname]
    assert _state(retired.hostname) == RETIRED
    assert (synced.plan.applied, _state("new-1")) == (True, HostState.IN_SERVICE)
    assert [c.name for c in synced.plan.changes if c.kind == "host"] == ["new-1"]
    again = sync_hosts(rows=rows, reason="synced from Slurm")
    assert (again.plan.changes, again.kept_retired, _state(retired.hostname)) == ([], [retired.hostname], RETIRED)


def test_a_sync_whose_every_host_is_retired_here_writes_nothing() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=1)
    host_retire(hostname=hosts[0].hostname, reason="failed for good")
    events = Event.objects.count()

    synced = sync_hosts(rows=[_row(pool, hosts[0])], reason="synced from Slurm")

    assert (synced.kept_retired, synced.plan.changes, synced.plan.applied) == ([hosts[0].hostname], [], False)
    assert Event.objects.count() == events


def test_a_host_restored_by_hand_is_synced_again() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=1)
    host_retire(hostname=hosts[0].hostname, reason="failed for good")
    host_restore(hostname=hosts[0].hostname, reason="repaired after all")

    synced = sync_hosts(rows=[_row(pool, hosts[0]) | {"sku": "h200"}], reason="synced from Slurm")

    assert synced.kept_retired == []
    assert Host.objects.get(hostname=hosts[0].hostname).sku == "h200"
