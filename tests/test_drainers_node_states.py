"""The drainers: Slurm node states a returned node really shows, and a Kubernetes node
whose cordon someone lifted while our annotation stayed on it. Fast: a fake Slurm and a fake API
client for the Slurm drainer, the stateful fake Kubernetes API server (tests/fake_kube.py)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client, KubeConfig
from opsplanner_adapters.kubernetes import CORDONED_BY, DrainSettings, KubeDrainer
from opsplanner_adapters.slurm import NodeState
from opsplanner_adapters.slurm_drainer import Drainer, DrainerConfig

from tests.fake_kube import FakeKube, serve_fake_kube

# -- Slurm ----------------------------------------------------------------------------------------------


class FakeSlurm:
    """One node; `resume` puts it in `after_resume` (what `sinfo %T` shows next)."""

    def __init__(self, state: str, reason: str, after_resume: str) -> None:
        self.state, self.reason, self.after_resume = state, reason, after_resume
        self.resumed = 0

    def node(self, name: str) -> NodeState:
        return NodeState(name=name, state=self.state, reason=self.reason)

    def jobs(self, name: str) -> list[Any]:
        return []

    def resume(self, name: str) -> None:
        self.resumed += 1
        self.state, self.reason = self.after_resume, ""

    def drain(self, name: str, reason: str) -> None:
        raise AssertionError("an undrain never drains")


class FakeApi:
    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []

    def heartbeat(self, item: dict[str, Any], *, lease_seconds: int) -> bool:
        return True

    def report(self, item: dict[str, Any], **report: Any) -> dict[str, Any]:
        self.reports.append({"id": item["id"], **report})
        return {}


def undrain_item() -> dict[str, Any]:
    deadline = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    return {"id": 5, "kind": "undrain", "attempt": 1, "hostname": "n1", "operation": 3, "deadline_at": deadline}


@pytest.mark.parametrize(
    "state",
    [
        "planned",  # idle, and the backfill scheduler has already planned a job on it
        "mixed-",  # running a job, another planned
        "allocated+",  # running a job while another completes
        "idle~",  # powered down by power saving: Slurm powers it up for the next job
        "idle#",  # powering up for a job
        "reserved",  # idle in an advanced reservation: takes its jobs
    ],
)
def test_an_undrain_is_done_once_the_resumed_node_takes_jobs_whatever_flag_slurm_adds(state: str) -> None:
    config = DrainerConfig(api_url="http://127.0.0.1:9", token="t", worker="w")
    slurm = FakeSlurm("drained", "opsplanner: operation 3 item 4", after_resume=state)
    api = FakeApi()
    drainer = Drainer(config, client=api, slurm=slurm)  # type: ignore[arg-type]

    drainer.start(undrain_item())
    drainer.advance(drainer.active[5])

    assert slurm.resumed == 1
    assert [(r["id"], r["ok"]) for r in api.reports] == [(5, True)], f"{state}: not seen back in service"


@pytest.mark.parametrize(
    "state", ["idle*", "idle@", "idle^", "idle$", "maint", "down*", "drained", "draining", "reboot^", "mixed*"]
)
def test_a_node_that_is_not_taking_jobs_is_not_counted_back_in_service(state: str) -> None:
    assert not NodeState(name="n1", state=state, reason="").schedulable


# -- Kubernetes -------------------------------------------------------------------------------------------


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[FakeKube, Client]]:
    fake = FakeKube()
    fake.add_node("n1")
    fake.add_node("n2")
    with serve_fake_kube(fake, tmp_path / "kubeconfig") as _url:
        client = Client(KubeConfig.from_file(tmp_path / "kubeconfig"))
        yield fake, client
        client.close()


def test_a_drain_cordons_again_a_node_someone_uncordoned_that_still_carries_our_annotation(kube) -> None:
    """`kubectl uncordon` clears spec.unschedulable and leaves our annotation: the next drain must
    cordon the node again, or evicted pods come straight back to a node reported drained."""
    fake, client = kube
    fake.set_node("n1", {"metadata": {"annotations": {CORDONED_BY: "opsplanner: an earlier item"}}})
    fake.add_pod("web-0", node="n1", owner=("ReplicaSet", "web"))

    drainer = KubeDrainer(client, DrainSettings(retry_pause_s=0.1, poll_s=0.05))
    outcome = drainer.drain("n1", owner="opsplanner: item 9", deadline=time.monotonic() + 10, keep_going=lambda: True)

    assert outcome.ok, outcome.reason
    node = fake.node("n1")
    assert node["spec"].get("unschedulable") is True, "reported drained while the node takes new pods"
    assert node["metadata"]["annotations"][CORDONED_BY] == "opsplanner: item 9"
    undrained = drainer.undrain("n1")
    assert undrained.ok
    assert undrained.result["uncordoned"]
    assert "unschedulable" not in fake.node("n1")["spec"]
