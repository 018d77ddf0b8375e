"""The Kubernetes drainer's drain logic against the stateful fake API server (tests/fake_kube.py),
through the real lightkube client: budgets that say no and then yes, DaemonSet and mirror pods left
alone, unmanaged pods refused, deadlines that name what blocks, and undrains that only uncordon
what we cordoned. Then `opsplanner-kube-drainer` as its own process against the real web server:
its configuration errors, and an operation on a pool whose drainer is "kubernetes" from drain to
uncordon (the ticks and the simulated executor run in this process)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from knox.models import AuthToken
from lightkube import Client, KubeConfig
from opsplanner_adapters.kube_drainer import ConfigError, KubeDrainerProcess, load_config
from opsplanner_adapters.kubernetes import CORDONED_BY, DrainSettings, KubeDrainer

from fleet import services as fleet_services
from fleet.models import Host, HostState, Pool
from opsplanner.models import HostTask, TaskState, WorkItem, WorkKind, WorkState
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from tests.browser import LiveServer, live_server_process  # noqa: F401 (a fixture)
from tests.builders import _catalogue
from tests.driving import instant_simulator
from tests.fake_kube import FakeKube, serve_fake_kube
from tests.processes import ROOT
from tests.trains_builders import make_user

FAST = DrainSettings(retry_pause_s=0.1, poll_s=0.05)


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[FakeKube, Client]]:
    fake = FakeKube()
    fake.add_node("n1")
    fake.add_node("n2")
    with serve_fake_kube(fake, tmp_path / "kubeconfig") as _url:
        client = Client(KubeConfig.from_file(tmp_path / "kubeconfig"))
        yield fake, client
        client.close()


def web_pods(fake: FakeKube, count: int, *, terminate_s: float = 0.0) -> None:
    """`count` replicas of a web app (a ReplicaSet), the first on n1, the rest on n2."""
    for index in range(count):
        node = "n1" if index == 0 else "n2"
        fake.add_pod(
            f"web-{index}", node=node, owner=("ReplicaSet", "web"), labels={"app": "web"}, terminate_s=terminate_s
        )


def drain(
    client: Client,
    *,
    settings: DrainSettings = FAST,
    within_s: float = 10.0,
    each_round: Callable[[int], bool] | None = None,
) -> object:
    rounds = iter(range(1_000_000))

    def keep_going() -> bool:
        return each_round(next(rounds)) if each_round else True

    drainer = KubeDrainer(client, settings)
    return drainer.drain("n1", owner="opsplanner: test", deadline=time.monotonic() + within_s, keep_going=keep_going)


def test_a_drain_cordons_evicts_the_pods_waits_until_they_are_gone_and_leaves_daemonset_and_mirror_pods(kube):
    fake, client = kube
    web_pods(fake, 2, terminate_s=0.3)
    fake.add_pod("agent-n1", node="n1", namespace="kube-system", owner=("DaemonSet", "agent"))
    fake.add_pod("kube-proxy-n1", node="n1", namespace="kube-system", mirror=True)
    fake.add_pod("job-1", node="n1", owner=("Job", "batch-1"))

    started = time.monotonic()
    outcome = drain(client)

    assert outcome.ok, outcome.reason
    assert time.monotonic() - started >= 0.3  # it waited for the terminating pod to go
    node = fake.node("n1")
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["annotations"][CORDONED_BY] == "opsplanner: test"
    assert fake.pod_names("n1") == {"kube-system/agent-n1", "kube-system/kube-proxy-n1"}
    assert outcome.result["evicted"] == ["default/job-1", "default/web-0"]
    assert outcome.result["skipped"] == {"daemonset": ["kube-system/agent-n1"], "mirror": ["kube-system/kube-proxy-n1"]}
    assert fake.pod_names("n2") == {"default/web-1"}


def test_a_budget_blocks_the_eviction_until_it_is_lowered_and_then_the_drain_finishes(kube):
    fake, client = kube
    web_pods(fake, 2)
    fake.add_pdb("web-pdb", selector={"app": "web"}, min_available=2)

    def operator_lowers_the_budget(round_no: int) -> bool:
        if round_no == 2:
            fake.set_pdb("web-pdb", min_available=1)
        return True

    outcome = drain(client, each_round=operator_lowers_the_budget)

    assert outcome.ok, outcome.reason
    assert len(fake.evictions()) >= 3  # refused (429) twice at least, then granted
    assert fake.pod_names("n1") == set()


def test_a_budget_allows_the_eviction_once_another_replica_is_ready(kube):
    fake, client = kube
    web_pods(fake, 2)
    fake.add_pdb("web-pdb", selector={"app": "web"}, min_available=2)

    def replacement_becomes_ready(round_no: int) -> bool:
        if round_no == 1:
            fake.add_pod("web-2", node="n2", owner=("ReplicaSet", "web"), labels={"app": "web"})
        return True

    outcome = drain(client, each_round=replacement_becomes_ready)

    assert outcome.ok, outcome.reason
    assert fake.pod_names() == {"default/web-1", "default/web-2"}


def test_an_unmanaged_pod_is_refused_without_force_and_evicted_with_it(kube):
    fake, client = kube
    web_pods(fake, 1)
    fake.add_pod("scratch", node="n1")

    refused = drain(client)

    assert not refused.ok
    assert "pods with no controller would be lost (set force to evict them): default/scratch" in refused.reason
    assert fake.evictions() == []  # nothing evicted before the refusal
    assert fake.node("n1")["spec"]["unschedulable"] is True  # cordoned, as kubectl leaves it

    forced = drain(client, settings=DrainSettings(force=True, retry_pause_s=0.1, poll_s=0.05))

    assert forced.ok, forced.reason
    assert fake.pod_names("n1") == set()


def test_a_drain_past_its_deadline_fails_naming_the_pods_that_block_and_the_budget(kube):
    fake, client = kube
    web_pods(fake, 2)
    fake.add_pdb("web-pdb", selector={"app": "web"}, min_available=2)
    fake.add_pod("db-0", node="n1", owner=("StatefulSet", "db"), terminate_s=60)
    fake.add_pod("cache-0", node="n1", owner=("ReplicaSet", "cache"), terminate_s=0.1)  # gone in time: not named

    outcome = drain(client, within_s=0.6)

    assert not outcome.ok
    assert outcome.reason.startswith("drain of node n1 timed out; 2 pods remain: ")
    assert "default/db-0 terminating" in outcome.reason
    assert (
        "default/web-0 blocked by PodDisruptionBudget web-pdb (needs 2 healthy pods and has 2 currently)"
        in outcome.reason
    )
    assert set(outcome.result["blocking"]) == {"default/db-0", "default/web-0"}
    assert outcome.result["evicted"] == ["default/cache-0", "default/db-0"]


def test_a_drain_whose_item_is_no_longer_ours_stops_without_an_outcome_to_report(kube):
    fake, client = kube
    web_pods(fake, 2)
    fake.add_pdb("web-pdb", selector={"app": "web"}, min_available=2)

    outcome = drain(client, each_round=lambda round_no: round_no < 1)

    assert outcome.abandoned
    assert fake.pod_names("n1") == {"default/web-0"}


def test_undrain_uncordons_the_node_we_cordoned_and_removes_our_annotation(kube):
    fake, client = kube
    web_pods(fake, 1)
    assert drain(client).ok

    outcome = KubeDrainer(client).undrain("n1")

    assert outcome.ok
    assert outcome.result["uncordoned"] is True
    node = fake.node("n1")
    assert "unschedulable" not in node["spec"]
    assert CORDONED_BY not in node["metadata"]["annotations"]


def test_a_node_cordoned_by_someone_else_is_drained_but_stays_cordoned_after_the_undrain(kube):
    fake, client = kube
    web_pods(fake, 1)
    fake.set_node("n1", {"spec": {"unschedulable": True}})

    drained = drain(client)
    undrained = KubeDrainer(client).undrain("n1")

    assert drained.ok
    assert drained.result["cordoned_by_us"] is False
    assert undrained.ok
    assert undrained.reason == "node n1 left cordoned: it was cordoned by someone else, not by OpsPlanner"
    assert fake.node("n1")["spec"]["unschedulable"] is True


def test_an_undrain_loses_no_cordon_made_between_its_read_and_its_write(kube):
    """Someone edits the node after our read: the conditional patch is refused (409), we read again."""
    fake, client = kube
    assert drain(client).ok
    drainer = KubeDrainer(client)
    real_get = client.get
    calls = []

    def get_then_someone_edits(*args, **kwargs):
        node = real_get(*args, **kwargs)
        if not calls:
            fake.set_node("n1", {"metadata": {"labels": {"edited": "yes"}}})
        calls.append(1)
        return node

    client.get = get_then_someone_edits
    outcome = drainer.undrain("n1")

    assert outcome.ok
    assert outcome.result["uncordoned"]
    assert len(calls) == 2
    assert fake.node("n1")["metadata"]["labels"]["edited"] == "yes"


def test_a_cordon_by_someone_else_between_our_read_and_write_wins_and_is_not_taken_over(kube):
    fake, client = kube
    real_get = client.get
    reads = []

    def get_then_someone_cordons(*args, **kwargs):
        node = real_get(*args, **kwargs)
        if not reads:
            fake.set_node("n1", {"spec": {"unschedulable": True}})
        reads.append(1)
        return node

    client.get = get_then_someone_cordons
    ours = KubeDrainer(client).cordon("n1", owner="opsplanner: test")

    assert ours is False
    assert len(reads) == 2
    assert CORDONED_BY not in fake.node("n1")["metadata"]["annotations"]


def test_a_node_the_cluster_does_not_know_fails_the_drain_with_one_line(kube):
    _fake, client = kube

    outcome = KubeDrainer(client, FAST).drain("n9", owner="x", deadline=time.monotonic() + 5, keep_going=lambda: True)

    assert not outcome.ok
    assert outcome.reason == 'node n9: nodes "n9" not found'


# The drainer process ---------------------------------------------------------------------------------
# Its lease, heartbeated every third of it: at 3 s a heartbeat late by 2 s on a loaded machine lost
# the item to the tick's expiry before the drainer could report (a clean-clone run, 2026-12-02).
LEASE_S = 6


def write_config(path: Path, *, url: str, token: str, kubeconfig: Path, extra: str = "") -> Path:
    path.write_text(
        f'[api]\nurl = "{url}"\ntoken = "{token}"\nworker = "kube-drainer-under-test"\n\n'
        f'[kubernetes]\nkubeconfig = "{kubeconfig}"\npoll_interval_s = 0.3\nlease_s = {LEASE_S}\n'
        f"retry_pause_s = 0.3\npoll_s = 0.2\ndeadline_margin_s = 2\n{extra}\n"
        '[nodes]\npattern = "{short}"\nmap = { "odd-one.kube.test" = "worker-7" }\n'
    )
    return path


def drainer_command(config: Path) -> list[str]:
    return [sys.executable, "-m", "opsplanner_adapters.kube_drainer", "--config", str(config)]


def drainer_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "adapters" / "src")}


def test_the_configuration_names_hosts_nodes_by_pattern_or_mapping(tmp_path):
    (tmp_path / "kubeconfig").write_text("{}")
    config = load_config(
        str(write_config(tmp_path / "d.toml", url="http://127.0.0.1:1", token="t", kubeconfig=tmp_path / "kubeconfig")),
        default_worker="w",
    )

    assert config.node_name("n1.kube.test") == "n1"
    assert config.node_name("odd-one.kube.test") == "worker-7"
    assert (config.lease_s, config.drain.force, config.drain.grace_seconds) == (LEASE_S, False, None)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("url = ", 'url = "ftp://x" #'), "api.url must be an http:// or https:// URL, not 'ftp://x'"),
        (("poll_s = 0.2", "force = 1"), "kubernetes.force must be true or false, not 1"),
        (("kubeconfig = ", 'kubeconfig = "missing" #'), "kubernetes.kubeconfig {dir}/missing does not exist"),
        (("{short}", "{rack}"), "nodes.pattern '{rack}' may only use {hostname} and {short}"),
    ],
)
def test_a_configuration_error_is_one_line_naming_the_key(tmp_path, change, message):
    (tmp_path / "kubeconfig").write_text("{}")
    path = write_config(tmp_path / "d.toml", url="http://127.0.0.1:1", token="t", kubeconfig=tmp_path / "kubeconfig")
    path.write_text(path.read_text().replace(*change, 1))

    with pytest.raises(ConfigError) as refused:
        load_config(str(path), default_worker="w")

    assert str(refused.value).startswith(message.replace("{dir}", str(tmp_path)))


def test_the_drainer_process_says_an_unusable_kubeconfig_in_one_line_and_exits(tmp_path):
    (tmp_path / "kubeconfig").write_text("clusters: [")
    config = write_config(tmp_path / "d.toml", url="http://127.0.0.1:1", token="t", kubeconfig=tmp_path / "kubeconfig")

    answer = subprocess.run(drainer_command(config), env=drainer_env(), capture_output=True, text=True, timeout=60)

    assert answer.returncode == 2
    lines = answer.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"opsplanner-kube-drainer: kubernetes: cannot use {tmp_path}/kubeconfig")


def test_the_process_fails_the_undrain_of_a_node_someone_else_cordoned_so_it_is_not_counted_in_service(kube, tmp_path):
    fake, client = kube
    fake.set_node("n1", {"spec": {"unschedulable": True}})
    (tmp_path / "kubeconfig").write_text("{}")
    config = load_config(
        str(write_config(tmp_path / "d.toml", url="http://127.0.0.1:1", token="t", kubeconfig=tmp_path / "kubeconfig")),
        default_worker="w",
    )
    process = KubeDrainerProcess(config, stop=lambda: False, drainer=KubeDrainer(client))

    outcome = process.undrain("n1")

    assert not outcome.ok
    assert (
        outcome.reason == "node n1 is cordoned by someone else; opsplanner does not uncordon a node it did not cordon"
    )
    assert fake.node("n1")["spec"]["unschedulable"] is True


@pytest.fixture
def kube_pool() -> Pool:
    """A pool whose drainer is Kubernetes; host n1.kube.test is node n1, running driver 550."""
    instant_simulator()
    catalogue = _catalogue()
    pool = fleet_services.pool_create(
        name="kube-pool",
        workload_class="ai_training",
        planned_buffer_hosts=1,
        failure_buffer_hosts=1,
        drainer="kubernetes",
    )
    domain = fleet_services.domain_create(pool=pool, name="rack-1", position=1)
    for node in ("n1", "n2"):
        host = fleet_services.host_create(hostname=f"{node}.kube.test", domain=domain, sku="gpu-h100-8x", gpu_count=8)
        for component, version in (("cuda-runtime", "12.4.1"), ("gpu-driver", "550.127.05"), ("bios", "2.14.0")):
            fleet_services.installed_version_set(host=host, version=catalogue[component][version])
    return pool


def drive_until(pool: Pool, condition: Callable[[], object], *, what: str, log: Path, timeout: float = 60) -> None:
    """Tick the pool and run the simulated executor until the condition holds (the drainer, its own
    process, does the Kubernetes side meanwhile)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            items = list(WorkItem.objects.filter(pool_id=pool.pk).values_list("kind", "state", "outcome_reason"))
            raise AssertionError(f"timed out waiting for {what}; items: {items}\ndrainer:\n{log.read_text()[-3000:]}")
        pool_tick(pool_id=pool.pk, kick=False)
        simulated_work_step()
        time.sleep(0.2)


@dataclass
class Running:
    fake: FakeKube
    log: Path


@pytest.fixture
def running_drainer(live_server_process: LiveServer, tmp_path: Path) -> Iterator[Running]:  # noqa: F811
    """`opsplanner-kube-drainer` as its own process against the real web server and a fake cluster
    (nodes n1 and n2, a DaemonSet pod on n1); the test arranges the rest."""
    fake = FakeKube()
    fake.add_node("n1")
    fake.add_node("n2")
    fake.add_pod("agent-n1", node="n1", namespace="kube-system", owner=("DaemonSet", "agent"))
    _, token = AuthToken.objects.create(make_user(Role.EXECUTOR))
    log = tmp_path / "drainer.log"
    with serve_fake_kube(fake, tmp_path / "kubeconfig"), log.open("wb") as sink:
        url, kubeconfig = live_server_process.url, tmp_path / "kubeconfig"
        config = write_config(tmp_path / "d.toml", url=url, token=token, kubeconfig=kubeconfig)
        drainer = subprocess.Popen(drainer_command(config), env=drainer_env(), stdout=sink, stderr=subprocess.STDOUT)
        try:
            yield Running(fake=fake, log=log)
        finally:
            drainer.terminate()
            drainer.wait(timeout=20)


def upgrade_n1(**fields: object) -> HostTask:
    operation = operation_submit(
        kind="upgrade",
        component="gpu-driver",
        version="560.35.03",
        scope="hosts: n1.kube.test",
        reason="rollout",
        **fields,  # type: ignore[arg-type]
    )
    return operation.tasks.get()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_upgrade_on_a_kubernetes_pool_waits_for_the_budget_and_the_undrain_uncordons_the_node(
    kube_pool: Pool, running_drainer: Running
):
    fake, log = running_drainer.fake, running_drainer.log
    web_pods(fake, 2, terminate_s=0.5)
    fake.add_pdb("web-pdb", selector={"app": "web"}, min_available=2)
    task = upgrade_n1()

    # The budget refuses (429) until an operator lowers it; meanwhile the drain heartbeats.
    drive_until(kube_pool, lambda: len(fake.evictions()) >= 3, what="refused evictions", log=log)
    drain = WorkItem.objects.get(host_task=task, kind=WorkKind.DRAIN)
    assert (drain.state, drain.adapter) == (WorkState.RUNNING, "kubernetes")
    annotations = fake.node("n1")["metadata"]["annotations"]
    assert annotations[CORDONED_BY] == f"opsplanner: operation {task.operation_id} item {drain.pk}"
    time.sleep(LEASE_S / 2)  # past the lease only if nothing heartbeats
    fake.set_pdb("web-pdb", min_available=1)
    done = lambda: HostTask.objects.get(pk=task.pk).state == TaskState.DONE  # noqa: E731
    drive_until(kube_pool, done, what="the upgrade to finish", log=log)

    drain.refresh_from_db()
    assert (drain.state, drain.attempts) == (WorkState.DONE, 1)
    assert "evicted: default/web-0" in drain.result["details"]
    assert "skipped (daemonset): kube-system/agent-n1" in drain.result["details"]
    undrain = WorkItem.objects.get(host_task=task, kind=WorkKind.UNDRAIN)
    assert (undrain.state, undrain.adapter) == (WorkState.DONE, "kubernetes")
    assert undrain.outcome_reason == "node n1 uncordoned"
    assert Host.objects.get(hostname="n1.kube.test").state == HostState.IN_SERVICE
    node = fake.node("n1")
    assert "unschedulable" not in node["spec"]
    assert CORDONED_BY not in node["metadata"]["annotations"]
    assert fake.pod_names("n1") == {"kube-system/agent-n1"}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_drain_the_budget_never_allows_fails_before_its_deadline_naming_the_pod_and_the_node_is_uncordoned(
    kube_pool: Pool, running_drainer: Running
):
    fake, log = running_drainer.fake, running_drainer.log
    web_pods(fake, 2)
    fake.add_pdb("web-pdb", selector={"app": "web"}, min_available=2)
    task = upgrade_n1(drain_timeout_s=8, max_attempts=1)

    undrain_done = lambda: WorkItem.objects.filter(host_task=task, kind=WorkKind.UNDRAIN, state="done").exists()  # noqa: E731
    drive_until(kube_pool, undrain_done, what="the failed drain's undrain", log=log)

    drain = WorkItem.objects.get(host_task=task, kind=WorkKind.DRAIN)
    assert drain.state == WorkState.FAILED
    # Our report (naming what blocks), not the tick's expiry: we stop a margin before the deadline.
    assert drain.outcome_reason == (
        "drain of node n1 timed out; 1 pods remain: default/web-0 blocked by PodDisruptionBudget web-pdb "
        "(needs 2 healthy pods and has 2 currently)"
    )
    assert HostTask.objects.get(pk=task.pk).state == TaskState.FAILED
    assert "unschedulable" not in fake.node("n1")["spec"]
    assert fake.pod_names("n1") == {"default/web-0", "kube-system/agent-n1"}
