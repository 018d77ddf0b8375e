"""The Kubernetes drainer against a real cluster you may disturb (kind, minikube, a test cluster).
Run by hand only:

    KUBECONFIG=~/.kube/config OPSPLANNER_KUBE_TEST_NODE=kind-worker \\
        .venv/bin/python -m pytest tests/kube_real_cluster.py -q -p no:cacheprovider

Its name does not match `test_*.py`, so the default run (and CI, which has no cluster) never
collects it: no skipped line. It drains the named node for real: a namespace
`opsplanner-drain-test` gets a ReplicaSet pinned to the node and a budget that forbids its
eviction; the drain must fail at its deadline naming the pod and the budget, then succeed once
the budget is gone; the undrain uncordons the node. The namespace is deleted afterwards and the
node uncordoned if we left it cordoned."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from lightkube import ApiError, Client, KubeConfig
from lightkube.models.apps_v1 import ReplicaSetSpec
from lightkube.models.core_v1 import Container, PodSpec, PodTemplateSpec
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.models.policy_v1 import PodDisruptionBudgetSpec
from lightkube.resources.apps_v1 import ReplicaSet
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget
from opsplanner_adapters.kubernetes import CORDONED_BY, DrainSettings, KubeDrainer

NAMESPACE = "opsplanner-drain-test"
LABELS = {"app": "opsplanner-drain-test"}


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    if not os.environ.get("KUBECONFIG") or not os.environ.get("OPSPLANNER_KUBE_TEST_NODE"):
        raise pytest.UsageError("set KUBECONFIG and OPSPLANNER_KUBE_TEST_NODE (a node this test may drain)")
    with Client(KubeConfig.from_file(os.environ["KUBECONFIG"])) as kube:
        yield kube


@pytest.fixture
def workload(client: Client) -> Iterator[str]:
    """A running pod of a ReplicaSet on the node, and a budget that forbids evicting it."""
    node = os.environ["OPSPLANNER_KUBE_TEST_NODE"]
    client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    template = PodTemplateSpec(
        metadata=ObjectMeta(labels=LABELS),
        spec=PodSpec(
            nodeSelector={"kubernetes.io/hostname": node},
            containers=[Container(name="pause", image="registry.k8s.io/pause:3.9")],
        ),
    )
    spec = ReplicaSetSpec(replicas=1, selector=LabelSelector(matchLabels=LABELS), template=template)
    client.create(ReplicaSet(metadata=ObjectMeta(name="drain-test", namespace=NAMESPACE), spec=spec))
    budget = PodDisruptionBudgetSpec(minAvailable=1, selector=LabelSelector(matchLabels=LABELS))
    client.create(PodDisruptionBudget(metadata=ObjectMeta(name="drain-test", namespace=NAMESPACE), spec=budget))
    _wait_until_running(client)
    try:
        yield node
    finally:
        client.delete(Namespace, NAMESPACE)
        KubeDrainer(client).undrain(node)  # a failed test must not leave the node cordoned by us


def _wait_until_running(client: Client, timeout_s: float = 120) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        pods = list(client.list(Pod, namespace=NAMESPACE, labels=LABELS))
        if pods and all(p.status.phase == "Running" for p in pods):
            return
        time.sleep(1)
    raise AssertionError(f"the test pod in {NAMESPACE} did not start within {timeout_s:.0f}s")


def test_a_real_budget_blocks_the_drain_until_removed_and_the_undrain_uncordons(client: Client, workload: str):
    node = workload
    drainer = KubeDrainer(client, DrainSettings(retry_pause_s=2, poll_s=1))

    blocked = drainer.drain(
        node, owner="opsplanner: real-cluster test", deadline=time.monotonic() + 15, keep_going=lambda: True
    )

    assert not blocked.ok
    assert f"{NAMESPACE}/drain-test-" in blocked.reason
    assert "blocked by PodDisruptionBudget drain-test" in blocked.reason
    assert client.get(Node, node).spec.unschedulable is True

    client.delete(PodDisruptionBudget, "drain-test", namespace=NAMESPACE)
    drained = drainer.drain(
        node, owner="opsplanner: real-cluster test", deadline=time.monotonic() + 120, keep_going=lambda: True
    )
    assert drained.ok, drained.reason
    on_node = [p for p in client.list(Pod, namespace=NAMESPACE) if p.spec.nodeName == node]
    assert on_node == []

    undrained = drainer.undrain(node)
    assert undrained.ok
    assert undrained.result["uncordoned"]
    after = client.get(Node, node)
    assert not after.spec.unschedulable
    assert CORDONED_BY not in (after.metadata.annotations or {})


def test_apierror_is_what_lightkube_raises_for_a_missing_node(client: Client):
    with pytest.raises(ApiError) as missing:
        client.get(Node, "opsplanner-no-such-node")
    assert missing.value.status.code == 404
