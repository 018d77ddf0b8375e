"""Adapters over HTTP in batches: many reports or heartbeats per request, each answered on its own;
a report that claims the same host's next item; and a claim that long-polls for ready work."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import pytest
from rest_framework.test import APIClient

from fleet.models import Pool
from opsplanner import clock
from opsplanner.models import Event, HostTask, WorkItem, WorkState
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from opsplanner.services.work_items import work_item_report, work_items_claim
from tests.api_helpers import token_client
from tests.builders import make_fleet
from tests.driving import in_threads
from tests.trains_builders import make_user

pytestmark = pytest.mark.django_db

UNKNOWN_ID = 987_654_321


@pytest.fixture
def executor() -> APIClient:
    return token_client(make_user(Role.EXECUTOR))


def external_reboot(hosts: int) -> Pool:
    """A pool whose reboot is drained and run by external adapters, ticked once: drains are ready."""
    pool, _ = make_fleet(domains=1, hosts_per_domain=hosts, planned_buffer_hosts=hosts)
    operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="r", drainer="external", executor="external")
    pool_tick(pool_id=pool.pk)
    return pool


def claim(client: APIClient, pool: Any, **body: Any) -> list[dict[str, Any]]:
    response = client.post("/api/work-items/claim/", {"pool": pool.pk, **body}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def report_batch(client: APIClient, reports: list[dict[str, Any]], key: str | None = None, **extra: Any) -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    return client.post("/api/work-items/report/", {"reports": reports, **extra}, format="json", headers=headers)


def done(item: dict[str, Any], attempt: int | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": item["id"], "attempt": attempt or item["attempt"], "outcome": "done", **extra}


def statuses(response: Any) -> list[tuple[int, str, str | None]]:
    assert response.status_code == 200, response.content
    return [(r["id"], r["status"], r.get("code")) for r in response.json()["results"]]


def task_state(item: dict[str, Any]) -> str:
    return HostTask.objects.get(pk=item["host_task"]).state


def item_events() -> int:
    return Event.objects.filter(subject_type="opsplanner.workitem").count()


# Batch report -------------------------------------------------------------------------------------


def test_a_batch_accepts_the_good_reports_and_refuses_the_bad_ones_with_their_codes(executor) -> None:
    pool = external_reboot(3)
    first, second, stale = claim(executor, pool, limit=3)
    response = report_batch(
        executor,
        [done(first), {"id": UNKNOWN_ID, "attempt": 1, "outcome": "done"}, done(stale, attempt=2), done(second)],
        key="batch-1",
    )
    assert statuses(response) == [
        (first["id"], "accepted", None),
        (UNKNOWN_ID, "refused", "not_found"),
        (stale["id"], "refused", "conflict"),
        (second["id"], "accepted", None),
    ]
    assert "attempt 1; the claim of attempt 2 expired" in response.json()["results"][2]["detail"]
    assert response.json()["next"] == []
    assert WorkItem.objects.get(pk=stale["id"]).state == WorkState.RUNNING
    pool_tick(pool_id=pool.pk)
    assert [task_state(first), task_state(second), task_state(stale)] == ["running", "running", "draining"]


def test_a_result_the_item_cannot_take_is_refused_as_invalid_without_failing_the_others(executor) -> None:
    pool = external_reboot(2)
    drains = claim(executor, pool, limit=2)
    WorkItem.objects.filter(pk=drains[0]["id"]).update(kind="verify")  # a verification must say passed
    response = report_batch(executor, [done(drains[0]), done(drains[1])], key="batch-invalid")
    assert statuses(response) == [(drains[0]["id"], "refused", "invalid"), (drains[1]["id"], "accepted", None)]
    assert "result.passed" in response.json()["results"][0]["detail"]


def test_a_replayed_batch_answers_the_same_and_changes_nothing(executor) -> None:
    pool = external_reboot(2)
    drains = claim(executor, pool, limit=2)
    reports = [done(drains[0]), done(drains[1]), {"id": UNKNOWN_ID, "attempt": 1, "outcome": "done"}]
    first = report_batch(executor, reports, key="batch-replayed")
    pool_tick(pool_id=pool.pk)
    events = item_events()
    again = report_batch(executor, reports, key="batch-replayed")
    assert (again.status_code, again.json(), again["Idempotent-Replayed"]) == (200, first.json(), "true")
    pool_tick(pool_id=pool.pk)
    assert item_events() == events
    assert WorkItem.objects.filter(kind="execute").count() == 2  # each drain consumed once
    assert [task_state(d) for d in drains] == ["running", "running"]


def test_a_batch_replayed_without_the_request_key_answers_duplicate_for_what_was_applied(executor) -> None:
    pool = external_reboot(2)
    drains = claim(executor, pool, limit=2)
    reports = [done(drains[0], report_key="r-0"), done(drains[1], report_key="r-1")]
    assert [s for _, s, _ in statuses(report_batch(executor, reports))] == ["accepted", "accepted"]
    events = item_events()
    assert [s for _, s, _ in statuses(report_batch(executor, reports))] == ["duplicate", "duplicate"]
    other_key = report_batch(executor, [done(drains[0], report_key="r-other")])
    assert statuses(other_key) == [(drains[0]["id"], "refused", "conflict")]
    assert item_events() == events


def test_a_report_without_any_key_is_refused_and_a_malformed_batch_applies_nothing(executor) -> None:
    pool = external_reboot(2)
    drains = claim(executor, pool, limit=2)
    assert statuses(report_batch(executor, [done(drains[0])])) == [(drains[0]["id"], "refused", "invalid")]
    malformed = report_batch(executor, [done(drains[1]), {"id": drains[0]["id"], "attempt": 1, "outcome": "maybe"}])
    assert malformed.status_code == 400
    assert "reports.1.outcome" in malformed.json()["errors"]
    assert set(WorkItem.objects.filter(pk__in=[d["id"] for d in drains]).values_list("state", flat=True)) == {
        WorkState.RUNNING
    }


def test_stale_attempts_are_refused_per_item_after_the_claims_expired_and_were_given_again(executor) -> None:
    pool = external_reboot(2)
    start = clock.now()
    moment = [start]
    with clock.use_clock(lambda: moment[0]):
        old = claim(executor, pool, limit=2, lease_seconds=30)
        moment[0] = start + dt.timedelta(seconds=31)
        pool_tick(pool_id=pool.pk)  # both taken back
        new = claim(executor, pool, limit=2, lease_seconds=30)
        assert [i["attempt"] for i in new] == [2, 2]
        response = report_batch(executor, [done(old[0]), done(new[1]), done(old[1])], key="stale")
    assert statuses(response) == [
        (old[0]["id"], "refused", "conflict"),
        (new[1]["id"], "accepted", None),
        (old[1]["id"], "refused", "conflict"),
    ]
    assert WorkItem.objects.get(pk=new[0]["id"]).state == WorkState.RUNNING


@pytest.mark.django_db(transaction=True)
def test_the_same_batch_sent_from_two_threads_at_once_is_applied_once() -> None:
    pool = external_reboot(3)
    user = make_user(Role.EXECUTOR)
    drains = claim(token_client(user), pool, limit=3)
    reports = [done(item) for item in drains]
    clients = [token_client(user), token_client(user)]
    answers: list[Any] = [None, None]
    barrier = threading.Barrier(2)

    def send(index: int) -> None:
        barrier.wait()
        answers[index] = report_batch(clients[index], reports, key="twice-at-once")

    assert in_threads(lambda: send(0), lambda: send(1)) == []
    assert answers[0].json() == answers[1].json()
    assert {r["status"] for r in answers[0].json()["results"]} == {"accepted"}
    ids = [item["id"] for item in drains]
    assert Event.objects.filter(kind="work_item.done", subject_id__in=ids).count() == 3


# Batch heartbeat ----------------------------------------------------------------------------------


def test_a_batch_heartbeat_extends_our_running_items_and_refuses_those_we_must_stop(executor) -> None:
    pool = external_reboot(3)
    ours, finished, stolen = claim(executor, pool, limit=3)
    assert statuses(report_batch(executor, [done(finished)], key="hb")) == [(finished["id"], "accepted", None)]
    WorkItem.objects.filter(pk=stolen["id"]).update(claimed_by="someone-else")
    items = [{"id": i["id"], "attempt": 1} for i in (ours, finished, stolen)] + [{"id": UNKNOWN_ID, "attempt": 1}]
    response = executor.post("/api/work-items/heartbeat/", {"items": items, "lease_seconds": 900}, format="json")
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [(r["id"], r["status"], r.get("code")) for r in results] == [
        (ours["id"], "extended", None),
        (finished["id"], "refused", "conflict"),
        (stolen["id"], "refused", "conflict"),
        (UNKNOWN_ID, "refused", "not_found"),
    ]
    assert "is done" in results[1]["detail"]
    assert "running for someone-else" in results[2]["detail"]
    extended = dt.datetime.fromisoformat(results[0]["lease_expires_at"])
    assert extended > clock.now() + dt.timedelta(seconds=800)
    assert WorkItem.objects.get(pk=ours["id"]).lease_expires_at == extended


def test_a_batch_heartbeat_with_a_stale_attempt_is_refused_and_names_the_attempt(executor) -> None:
    pool = external_reboot(1)
    (item,) = claim(executor, pool)
    response = executor.post("/api/work-items/heartbeat/", {"items": [{"id": item["id"], "attempt": 2}]}, format="json")
    (result,) = response.json()["results"]
    assert (result["status"], result["code"]) == ("refused", "conflict")
    assert "the claim of attempt 2 expired" in result["detail"]


# Claim next ---------------------------------------------------------------------------------------


def verifying(client: APIClient, pool: Any) -> None:
    """Drain and run every host of the pool: each then has its three verifications ready."""
    for stage in ("drain", "execute"):
        items = claim(client, pool, limit=100)
        assert {s for _, s, _ in statuses(report_batch(client, [done(i) for i in items], key=stage))} == {"accepted"}
        pool_tick(pool_id=pool.pk)


def test_a_report_may_claim_the_next_ready_item_of_the_same_host_and_none_of_another(executor) -> None:
    pool = external_reboot(2)
    verifying(executor, pool)
    (first,) = claim(executor, pool, kinds=["verify"], limit=1)
    passed = {"outcome": "done", "attempt": 1, "result": {"passed": True}, "claim_next": True}
    seen = [first]
    for key in ("v-1", "v-2", "v-3"):
        path = f"/api/work-items/{seen[-1]['id']}/report/"
        response = executor.post(path, passed, format="json", headers={"Idempotency-Key": key})
        assert response.status_code == 200, response.content
        assert response.json()["state"] == "done"
        if response.json()["next"] is None:
            break
        seen.append(response.json()["next"])
        assert (seen[-1]["state"], seen[-1]["claimed_by"]) == ("running", executor.user.get_username())
    assert [item["host"] for item in seen] == [first["host"]] * 3
    assert response.json()["next"] is None  # the other host's verifications stay ready
    assert WorkItem.objects.filter(state=WorkState.READY, kind="verify").exclude(host_id=first["host"]).count() == 3
    retried = executor.post(path, passed, format="json", headers={"Idempotency-Key": "v-3"})
    assert (retried.status_code, retried.json()["next"]) == (200, None)


def test_a_batch_report_claims_the_next_item_of_each_host_it_reported(executor) -> None:
    pool = external_reboot(2)
    verifying(executor, pool)
    claimed = claim(executor, pool, kinds=["verify"], limit=6)
    one_per_host = list({item["host"]: item for item in claimed}.values())
    WorkItem.objects.filter(pk__in=[i["id"] for i in claimed if i not in one_per_host]).update(
        state=WorkState.READY, claimed_by="", claimed_at=None, lease_expires_at=None
    )
    reports = [done(item, result={"passed": True}) for item in one_per_host]
    response = report_batch(executor, reports, key="next-each", claim_next=True, claim_kinds=["verify"])
    assert [s for _, s, _ in statuses(response)] == ["accepted", "accepted"]
    following = response.json()["next"]
    assert sorted(item["host"] for item in following) == sorted(item["host"] for item in one_per_host)
    assert {item["state"] for item in following} == {"running"}


def test_claim_next_answers_null_when_the_host_has_nothing_ready(executor) -> None:
    pool = external_reboot(2)
    (drain, other) = claim(executor, pool, limit=2)
    body = {"outcome": "done", "attempt": 1, "claim_next": True}
    response = executor.post(
        f"/api/work-items/{drain['id']}/report/", body, format="json", headers={"Idempotency-Key": "alone"}
    )
    assert (response.status_code, response.json()["next"]) == (200, None)
    plain = executor.post(
        f"/api/work-items/{other['id']}/report/",
        {"outcome": "done", "attempt": 1},
        format="json",
        headers={"Idempotency-Key": "plain"},
    )
    assert (plain.status_code, plain.json()["next"]) == (200, None)


# Long poll ----------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_answers_as_soon_as_an_item_becomes_ready() -> None:
    pool = external_reboot(1)
    executor = token_client(make_user(Role.EXECUTOR))
    (drain,) = claim(executor, pool)
    worker = executor.user.get_username()

    def finish_the_drain_a_second_later() -> None:
        time.sleep(1)
        work_item_report(item_id=drain["id"], worker=worker, key="drained", outcome="done", attempt=1)
        pool_tick(pool_id=pool.pk)  # the execute item becomes ready

    started = time.monotonic()
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: errors.extend(in_threads(finish_the_drain_a_second_later)))
    thread.start()  # in_threads runs it on its own connection; this thread only keeps it from blocking us
    (item,) = claim(executor, pool, kinds=["execute"], wait_seconds=15)
    waited = time.monotonic() - started
    thread.join()
    assert errors == []
    assert (item["kind"], item["host"], item["state"]) == ("execute", drain["host"], "running")
    assert 0.9 < waited < 5


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_answers_an_empty_list_at_its_bound() -> None:
    pool = external_reboot(1)
    executor = token_client(make_user(Role.EXECUTOR))
    claim(executor, pool)
    started = time.monotonic()
    assert claim(executor, pool, wait_seconds=1) == []
    assert 1 <= time.monotonic() - started < 3


def test_a_claim_with_work_ready_does_not_wait_and_a_wait_beyond_the_cap_is_refused(executor) -> None:
    pool = external_reboot(1)
    started = time.monotonic()
    assert len(claim(executor, pool, wait_seconds=20)) == 1
    assert time.monotonic() - started < 1
    response = executor.post("/api/work-items/claim/", {"wait_seconds": 61}, format="json")
    assert response.status_code == 400
    assert "wait_seconds" in response.json()["errors"]


def test_work_items_claim_takes_only_the_given_hosts_items() -> None:
    external_reboot(3)
    host_id = WorkItem.objects.order_by("-id").values_list("host_id", flat=True).first()
    (item,) = work_items_claim(worker="drainer", host_id=host_id, limit=10)
    assert item.host_id == host_id
    assert WorkItem.objects.filter(state=WorkState.READY).count() == 2


def test_items_of_other_adapters_do_not_exist_for_a_batch_even_under_the_same_worker_name(executor) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="r")  # simulated adapters
    pool_tick(pool_id=pool.pk)
    worker = executor.user.get_username()
    (item,) = work_items_claim(worker=worker, adapter="simulated", limit=1)
    response = report_batch(executor, [{"id": item.pk, "attempt": 1, "outcome": "done"}], key="not-mine")
    assert statuses(response) == [(item.pk, "refused", "not_found")]
    beat = executor.post("/api/work-items/heartbeat/", {"items": [{"id": item.pk, "attempt": 1}]}, format="json")
    assert [r["code"] for r in beat.json()["results"]] == ["not_found"]
    assert WorkItem.objects.get(pk=item.pk).state == WorkState.RUNNING
