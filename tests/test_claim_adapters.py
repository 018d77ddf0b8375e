"""Every API adapter (external, agent, ssh, slurm, kubernetes) claims, heartbeats and reports its own
items through the same endpoints; a claim may name one host; no adapter gets another's items."""

from __future__ import annotations

from typing import Any

import pytest

from opsplanner.models import WorkItem, WorkKind, WorkState
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from opsplanner.services.work_items import work_item_report, work_items_claim
from tests.api_helpers import role_client
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db


def agent_executes(hosts: int = 2) -> tuple[Any, list[Any]]:
    """Hosts drained by an external drainer (done here), with execute items for the agent."""
    pool, fleet_hosts = make_fleet(domains=1, hosts_per_domain=hosts, planned_buffer_hosts=hosts)
    operation_submit(
        kind="upgrade",
        scope=f"pool {pool.name}",
        component="gpu-driver",
        version="560.35.03",
        reason="r",
        drainer="external",
        executor="agent",
    )
    pool_tick(pool_id=pool.pk)
    for item in work_items_claim(worker="drainer", kinds=[WorkKind.DRAIN], limit=hosts):
        work_item_report(item_id=item.pk, worker="drainer", key=f"d{item.pk}", outcome="done")
    pool_tick(pool_id=pool.pk)
    return pool, fleet_hosts


def test_it_claims_only_the_named_adapters_items_and_only_for_the_named_host() -> None:
    _, hosts = agent_executes(2)
    executor = role_client(Role.EXECUTOR)
    assert executor.post("/api/work-items/claim/", {"kinds": ["execute"]}, format="json").json() == []
    answer = executor.post(
        "/api/work-items/claim/",
        {"adapter": "agent", "host": hosts[1].hostname, "kinds": ["execute"], "limit": 5},
        format="json",
    )
    assert answer.status_code == 200, answer.content
    (item,) = answer.json()
    assert (item["hostname"], item["adapter"], item["params"]["version"]) == (hosts[1].hostname, "agent", "560.35.03")
    assert WorkItem.objects.get(host=hosts[0], kind=WorkKind.EXECUTE).state == WorkState.READY


def test_it_refuses_a_claim_for_an_unknown_host_or_adapter_by_name() -> None:
    executor = role_client(Role.EXECUTOR)
    answer = executor.post("/api/work-items/claim/", {"adapter": "agent", "host": "no-such-host"}, format="json")
    assert answer.status_code == 400
    assert answer.json()["errors"] == {"host": ["There is no host 'no-such-host'."]}
    answer = executor.post("/api/work-items/claim/", {"adapter": "simulated"}, format="json")
    assert answer.status_code == 400
    assert list(answer.json()["errors"]) == ["adapter"]


def test_an_agent_heartbeats_and_reports_with_its_steps_kept_in_the_result() -> None:
    agent_executes(1)
    executor = role_client(Role.EXECUTOR)
    (item,) = executor.post("/api/work-items/claim/", {"adapter": "agent", "worker": "a"}, format="json").json()
    beat = executor.post(f"/api/work-items/{item['id']}/heartbeat/", {"attempt": 1, "worker": "a"}, format="json")
    assert beat.status_code == 200, beat.content
    step = {"name": "install:gpu-driver", "exit_code": 3, "output_tail": "checksum mismatch\n", "duration_s": 1.5}
    report = executor.post(
        f"/api/work-items/{item['id']}/report/",
        {"outcome": "failed", "attempt": 1, "worker": "a", "reason": "exited 3", "result": {"steps": [step]}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    assert report.status_code == 200, report.content
    stored = WorkItem.objects.get(pk=item["id"])
    assert stored.state == WorkState.FAILED
    assert stored.result["steps"][0]["output_tail"] == "checksum mismatch\n"
    assert stored.result["steps"][0]["timed_out"] is False
    listed = executor.get("/api/work-items/", {"adapter": "agent"}).json()["results"]
    assert [row["id"] for row in listed] == [item["id"]]


def test_a_batch_report_claims_the_next_item_of_the_same_adapter() -> None:
    pool, hosts = agent_executes(1)
    executor = role_client(Role.EXECUTOR)
    (item,) = executor.post("/api/work-items/claim/", {"adapter": "agent"}, format="json").json()
    result = {"versions": {"gpu-driver": "560.35.03"}}
    work_item_report(
        item_id=item["id"],
        worker=WorkItem.objects.get(pk=item["id"]).claimed_by,
        key="e",
        outcome="done",
        result=result,
    )
    pool_tick(pool_id=pool.pk)  # three verify items for the agent
    (verify,) = executor.post(
        "/api/work-items/claim/", {"adapter": "agent", "kinds": ["verify"], "limit": 1}, format="json"
    ).json()
    answer = executor.post(
        "/api/work-items/report/",
        {
            "reports": [{"id": verify["id"], "attempt": 1, "outcome": "done", "result": {"passed": True}}],
            "claim_next": True,
        },
        format="json",
        HTTP_IDEMPOTENCY_KEY="batch-1",
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["results"][0]["status"] == "accepted"
    (following,) = answer.json()["next"]
    assert (following["adapter"], following["kind"], following["hostname"]) == ("agent", "verify", hosts[0].hostname)
