"""`fleet_sync slurm` against a real Slurm cluster (n1, n2 with feature rack1; n3, n4 with rack2;
all in partition main): the nodes become hosts through the fleet file's plan and apply."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from fleet import services as fleet_services
from fleet.models import Host, MaintenanceDomain, Pool
from fleet.sync.slurm import SlurmRules, host_rows, nodes_from_scontrol, slurm_nodes
from opsplanner.models import Event
from tests.slurm_cluster import SlurmCluster, slurm_cluster  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def sync(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("fleet_sync", "slurm", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def make_pool(name: str) -> Pool:
    return fleet_services.pool_create(
        name=name, workload_class="ai_training", planned_buffer_hosts=1, failure_buffer_hosts=1
    )


def test_sinfo_json_and_scontrol_read_the_same_nodes(slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    from_json = slurm_nodes(reader="json")
    assert from_json == slurm_nodes(reader="scontrol")
    assert [(n.name, n.partitions, n.features) for n in from_json] == [
        ("n1", ("main",), ("rack1",)),
        ("n2", ("main",), ("rack1",)),
        ("n3", ("main",), ("rack2",)),
        ("n4", ("main",), ("rack2",)),
    ]


def test_a_dry_run_proposes_every_node_as_a_host_of_its_partitions_pool_and_writes_nothing(
    slurm_cluster: SlurmCluster,  # noqa: F811
) -> None:
    make_pool("main")
    events = Event.objects.count()

    out, _ = sync("--dry-run", "--hostname-format", "{node}.cluster.test")

    for node in slurm_cluster.nodes:
        assert f"{node}.cluster.test" in out
    assert "Plan (dry run):" in out
    assert not Host.objects.exists()
    assert not MaintenanceDomain.objects.exists()
    assert Event.objects.count() == events


def test_a_sync_creates_the_hosts_in_their_racks_and_a_second_sync_changes_nothing(
    slurm_cluster: SlurmCluster,  # noqa: F811
) -> None:
    make_pool("ai-train")

    out, _ = sync("--pool-map", "main=ai-train", "--sku", "cpu-1x")

    assert "Applied" in out
    hosts = {h.hostname: (h.pool.name, h.domain.name, h.sku, h.labels["slurm_node"]) for h in Host.objects.all()}
    assert hosts == {
        "n1": ("ai-train", "rack1", "cpu-1x", "n1"),
        "n2": ("ai-train", "rack1", "cpu-1x", "n2"),
        "n3": ("ai-train", "rack2", "cpu-1x", "n3"),
        "n4": ("ai-train", "rack2", "cpu-1x", "n4"),
    }
    events = Event.objects.count()
    again, _ = sync("--pool-map", "main=ai-train", "--sku", "cpu-1x")
    assert "Nothing to do." in again
    assert Event.objects.count() == events


def test_a_host_retired_here_stays_retired_though_slurm_still_lists_it(
    slurm_cluster: SlurmCluster,  # noqa: F811
) -> None:
    from fleet.models.hosts import RETIRED
    from fleet.services.host_changes import host_retire

    make_pool("main")
    sync()
    host_retire(hostname="n2", reason="failed for good; still in slurm.conf")

    out, _ = sync()

    assert "kept retired, though Slurm lists it: host n2 is retired: restore it (POST /api/hosts/n2/restore/)" in out
    assert "Nothing to do." in out
    assert Host.all_objects.get(hostname="n2").state == RETIRED


def test_a_naming_rule_gives_the_domain_when_no_feature_does(slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    rules = SlurmRules(domain_feature="row", domain_pattern=r"^(?P<domain>n)\d+$", hostname_format="{node}.dc1")
    found = host_rows(slurm_nodes(), rules)
    assert found.problems == []
    assert {(row["hostname"], row["pool"], row["domain"]) for row in found.rows} == {
        (f"{node}.dc1", "main", "n") for node in slurm_cluster.nodes
    }


def test_a_partition_with_no_pool_and_a_node_with_no_domain_are_named_and_nothing_is_written(
    slurm_cluster: SlurmCluster,  # noqa: F811
) -> None:
    err = StringIO()
    with pytest.raises(CommandError, match="4 errors in what Slurm lists; nothing was written"):
        call_command("fleet_sync", "slurm", "--pool-map", "main=nowhere", stdout=StringIO(), stderr=err)
    assert "error: node n1: pool: no pool 'nowhere'" in err.getvalue()
    with pytest.raises(CommandError, match="4 errors"):
        sync("--domain-feature", "row")
    found = host_rows(slurm_nodes(), SlurmRules(domain_feature="row"))
    assert [p.place for p in found.problems] == ["node n1", "node n2", "node n3", "node n4"]
    skipped = host_rows(slurm_nodes(), SlurmRules(pool_map={"gpu": "ai-train"}))
    assert (skipped.rows, len(skipped.skipped)) == ([], 4)
    assert not Host.objects.exists()


def test_gpus_come_from_the_gpu_gres_and_the_sku_from_its_feature() -> None:
    line = (
        "NodeName=gpu7 Arch=x86_64 AvailableFeatures=rack_B,sku-h100 ActiveFeatures=rack_B,sku-h100 "
        "Gres=gpu:h100:8(S:0-1) NodeHostName=gpu7.dc OS=Linux 6.1.0 #1 SMP Partitions=train,debug State=IDLE"
    )
    (node,) = nodes_from_scontrol(line)
    rules = SlurmRules(pool_map={"train": "ai-train"}, sku_feature="sku-", hostname_format="{hostname}")
    assert host_rows([node], rules).rows == [
        {
            "hostname": "gpu7.dc",
            "pool": "ai-train",
            "domain": "rack-b",
            "sku": "sku-h100",
            "gpu_count": 8,
            "labels": {"slurm_node": "gpu7", "slurm_partitions": "train,debug"},
        }
    ]
