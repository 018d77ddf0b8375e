"""The fake Kubernetes API server (tests/fake_kube.py) checked against a real client: `kubectl drain`
(Debian's kubernetes-client) run against the same arranged cluster as our drainer reaches the same
outcome: cordoned, evicted, DaemonSet pod kept; a blocking budget retried until the timeout; an
unmanaged pod refused without --force. If kubectl accepts the fake, the drainer's tests test
against something shaped like a real API server."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from lightkube import Client, KubeConfig
from opsplanner_adapters.kubernetes import DrainSettings, KubeDrainer

from tests.fake_kube import FakeKube, serve_fake_kube

KUBECTL = shutil.which("kubectl")


@contextmanager
def cluster(tmp_path: Path, arrange: Callable[[FakeKube], None]) -> Iterator[tuple[FakeKube, Path]]:
    fake = FakeKube()
    fake.add_node("n1")
    fake.add_node("n2")
    arrange(fake)
    kubeconfig = tmp_path / f"kubeconfig-{time.monotonic_ns()}"
    with serve_fake_kube(fake, kubeconfig):
        yield fake, kubeconfig


def kubectl(kubeconfig: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    assert KUBECTL, "kubectl is not installed: install Debian's kubernetes-client (`.ci/run` does)"
    command = [KUBECTL, "--kubeconfig", str(kubeconfig), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def kubectl_drain(kubeconfig: Path, *extra: str, timeout_s: int = 20) -> subprocess.CompletedProcess:
    args = ["drain", "n1", "--ignore-daemonsets", "--delete-emptydir-data", f"--timeout={timeout_s}s", *extra]
    return kubectl(kubeconfig, *args, timeout=timeout_s + 30)


def our_drain(kubeconfig: Path, *, within_s: float, force: bool = False) -> object:
    with Client(KubeConfig.from_file(kubeconfig)) as client:
        drainer = KubeDrainer(client, DrainSettings(force=force, retry_pause_s=0.2, poll_s=0.1))
        return drainer.drain(
            "n1", owner="opsplanner: test", deadline=time.monotonic() + within_s, keep_going=lambda: True
        )


def apps(fake: FakeKube) -> None:
    fake.add_pod("web-0", node="n1", owner=("ReplicaSet", "web"), labels={"app": "web"}, terminate_s=0.5)
    fake.add_pod("web-1", node="n2", owner=("ReplicaSet", "web"), labels={"app": "web"})
    fake.add_pod("agent-n1", node="n1", namespace="kube-system", owner=("DaemonSet", "agent"))
    fake.add_pod("agent-n2", node="n2", namespace="kube-system", owner=("DaemonSet", "agent"))


def blocking_budget(fake: FakeKube) -> None:
    apps(fake)
    fake.add_pdb("web-pdb", selector={"app": "web"}, min_available=2)


def unmanaged_pod(fake: FakeKube) -> None:
    apps(fake)
    fake.add_pod("scratch", node="n1")


def test_kubectl_drain_cordons_evicts_and_keeps_the_daemonset_pod_as_our_drainer_does(tmp_path):
    with cluster(tmp_path, apps) as (fake, kubeconfig):
        answer = kubectl_drain(kubeconfig)
        by_kubectl = (fake.node("n1")["spec"], fake.pod_names())
    with cluster(tmp_path, apps) as (fake, kubeconfig):
        ours = our_drain(kubeconfig, within_s=20)
        by_us = (fake.node("n1")["spec"], fake.pod_names())

    assert answer.returncode == 0, answer.stderr
    assert "node/n1 cordoned" in answer.stdout
    assert "pod/web-0 evicted" in answer.stdout
    assert "node/n1 drained" in answer.stdout
    assert "ignoring DaemonSet-managed Pods: kube-system/agent-n1" in answer.stderr
    assert ours.ok, ours.reason
    assert (
        by_kubectl
        == by_us
        == (
            {"unschedulable": True},
            {"default/web-1", "kube-system/agent-n1", "kube-system/agent-n2"},
        )
    )


@pytest.mark.slow
def test_kubectl_drain_retries_a_blocking_budget_and_times_out_as_our_drainer_does(tmp_path):
    with cluster(tmp_path, blocking_budget) as (fake, kubeconfig):
        answer = kubectl_drain(kubeconfig, timeout_s=7)
        kubectl_evictions, kubectl_left = len(fake.evictions()), fake.pod_names("n1")
    with cluster(tmp_path, blocking_budget) as (fake, kubeconfig):
        ours = our_drain(kubeconfig, within_s=1.0)
        our_left = fake.pod_names("n1")

    assert answer.returncode == 1
    # kubectl read our 429 as TooManyRequests (it retries only those, every 5 s) until its timeout.
    assert answer.stderr.count("(will retry after 5s): Cannot evict pod as it would violate the pod's disruption") >= 2
    assert 'error when evicting pods/"web-0" -n "default": global timeout reached: 7s' in answer.stderr
    assert kubectl_evictions >= 2
    assert not ours.ok
    assert "default/web-0 blocked by PodDisruptionBudget web-pdb" in ours.reason
    assert kubectl_left == our_left == {"default/web-0", "kube-system/agent-n1"}


def test_kubectl_refuses_an_unmanaged_pod_without_force_as_our_drainer_does(tmp_path):
    with cluster(tmp_path, unmanaged_pod) as (fake, kubeconfig):
        refused = kubectl_drain(kubeconfig)
        refused_left = fake.pod_names("n1")
        forced = kubectl_drain(kubeconfig, "--force")
        forced_left = fake.pod_names("n1")
    with cluster(tmp_path, unmanaged_pod) as (fake, kubeconfig):
        ours = our_drain(kubeconfig, within_s=10)

    assert refused.returncode == 1
    assert "cannot delete Pods that declare no controller (use --force to override): default/scratch" in refused.stderr
    assert refused_left == {"default/scratch", "default/web-0", "kube-system/agent-n1"}
    assert forced.returncode == 0, forced.stderr
    assert forced_left == {"kube-system/agent-n1"}
    assert not ours.ok
    assert "default/scratch" in ours.reason
    assert fake.pod_names("n1") == refused_left


def test_kubectl_uncordon_undoes_the_cordon_through_a_strategic_merge_patch(tmp_path):
    with cluster(tmp_path, apps) as (fake, kubeconfig):
        assert kubectl_drain(kubeconfig).returncode == 0
        answer = kubectl(kubeconfig, "uncordon", "n1")
        listed = kubectl(kubeconfig, "get", "pods", "-A", "--field-selector", "spec.nodeName=n1", "-o", "name")

        assert answer.returncode == 0, answer.stderr
        assert answer.stdout.strip() == "node/n1 uncordoned"
        assert "unschedulable" not in fake.node("n1")["spec"]
        assert listed.stdout.split() == ["pod/agent-n1"]


def test_kubectl_json_and_merge_patches_change_the_fakes_node(tmp_path):
    with cluster(tmp_path, apps) as (fake, kubeconfig):
        labelled = kubectl(
            kubeconfig,
            "patch",
            "node",
            "n1",
            "--type",
            "json",
            "-p",
            '[{"op": "add", "path": "/metadata/labels/zone", "value": "a"}]',
        )
        annotated = kubectl(kubeconfig, "annotate", "node", "n1", "owner=team-a")

        assert labelled.returncode == 0, labelled.stderr
        assert annotated.returncode == 0, annotated.stderr
        meta = fake.node("n1")["metadata"]
        assert (meta["labels"]["zone"], meta["annotations"]["owner"]) == ("a", "team-a")
