"""The tick reads the tasks of given drains by their key (the pre-return gate at every verified host,
the handover, the repair's count of failed repairs): through an index, never by scanning every task
ever made, which grew with the history (4 ms a read after 30 simulated days of 1,000 hosts).

The index on the drain key holds only the states these reads ask for (host_task_drain_idx): a read
asking for another state could not use it, and PostgreSQL would scan the table without a word.
Each read the flows below make is planned with sequential scans disabled, which PostgreSQL then
takes only when no index can answer."""

from __future__ import annotations

import re

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from opsplanner.models import HostTask, TaskState
from opsplanner.services.operations import operation_submit
from tests.builders import make_fleet
from tests.driving import drive, instant_simulator

pytestmark = pytest.mark.django_db

KEYED = re.compile(r"\b(drain_key|host_id|operation_id|id)\b")  # an index condition on a key, not a state


def drain_key_reads(captured: CaptureQueriesContext) -> set[str]:
    return {
        query["sql"]
        for query in captured.captured_queries
        if query["sql"].startswith("SELECT") and '"drain_key" = ANY' in query["sql"]
    }


def unbounded_task_scans(sql: str) -> list[str]:
    """The plan's scans of the task table that no key bounds (a sequential scan, an index read whole
    or by state alone: every task that ever ended in that state), planned with sequential scans
    disabled, which PostgreSQL then takes only where no index can answer."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}")
        (plan,) = cursor.fetchone()
    unbounded = []
    nodes = [plan[0]["Plan"]]
    while nodes:
        node = nodes.pop()
        nodes.extend(node.get("Plans", []))
        scans_tasks = node.get("Relation Name") == "opsplanner_hosttask" or node.get("Index Name", "").startswith(
            ("host_task", "opsplanner_hosttask")
        )
        if scans_tasks and node["Node Type"] != "Bitmap Heap Scan" and not KEYED.search(node.get("Index Cond", "")):
            unbounded.append(f"{node['Node Type']} {node.get('Index Name', '')} {node.get('Index Cond', '')}".strip())
    return unbounded


def assert_no_read_scans_every_task(reads: set[str]) -> None:
    scanning = {sql: scans for sql in reads if (scans := unbounded_task_scans(sql))}
    assert scanning == {}, "drain reads scanning every task: " + "\n\n".join(f"{v}: {k}" for k, v in scanning.items())


def test_the_reads_of_a_drain_with_two_upgrades_handed_over_go_through_an_index() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
    scope = f"hosts: {hosts[0].hostname}"
    for component, version in (("bios", "2.16.0"), ("gpu-driver", "560.35.03")):  # one drain, handed over
        operation_submit(kind="upgrade", scope=scope, component=component, version=version, reason="u", actor="op")

    with CaptureQueriesContext(connection) as captured:
        drive(pool)

    states = sorted(HostTask.objects.values_list("state", flat=True))
    assert states == [TaskState.DONE, TaskState.HANDED_OVER]
    reads = drain_key_reads(captured)
    assert len(reads) >= 2, reads  # the gate's upgrades of the drain, the upgrades applied before
    assert_no_read_scans_every_task(reads)


def test_the_reads_of_a_failed_repair_go_through_an_index() -> None:
    instant_simulator(execute_failure_rate=1)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="r", max_attempts=1, actor="op")

    with CaptureQueriesContext(connection) as captured:
        drive(pool)  # the reboot fails, then each repair, until the host is escalated

    assert HostTask.objects.filter(state=TaskState.FAILED).count() > 1
    reads = drain_key_reads(captured)
    assert reads, "the failed repairs are counted within their drain"
    assert_no_read_scans_every_task(reads)
