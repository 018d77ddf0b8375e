"""GET /metrics: Prometheus text computed from the database, for the metrics token or a reader."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection
from django.db.models import Count
from django.test.utils import CaptureQueriesContext

from console.metrics import MetricFamily, render
from fleet.models import HostState
from opsplanner.clock import use_clock
from opsplanner.models import HostTask, TaskState, WaitingCode, WorkerHeartbeat, WorkItem, WorkKind, WorkState
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from opsplanner.services.work_items import work_item_report, work_items_claim
from tests.builders import make_fleet
from tests.trains_builders import make_train, make_user

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-for-the-tests-0123456789"
T0 = dt.datetime(2030, 1, 6, 12, 0, tzinfo=dt.UTC)
MAX_QUERIES = 10

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')


class Clock:
    def __init__(self, start: dt.datetime) -> None:
        self.at = start

    def __call__(self) -> dt.datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += dt.timedelta(seconds=seconds)


@pytest.fixture
def clock():
    source = Clock(T0)
    with use_clock(source):
        yield source


@pytest.fixture
def token(settings):
    settings.METRICS_TOKEN = TOKEN
    return TOKEN


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), value)


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """Parse exposition text strictly: HELP then TYPE once per family before its samples, every
    sample well-formed and unique. Returns {(name, labels): value}."""
    assert text.endswith("\n")
    samples: dict[tuple[str, frozenset], float] = {}
    typed: dict[str, str] = {}
    helped: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert name not in helped, f"second HELP for {name}"
            helped.add(name)
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name in helped, line
            assert name not in typed, line
            assert kind in {"gauge", "counter", "untyped", "summary", "histogram"}
            typed[name] = kind
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, raw_labels, value = match.groups()
        assert name in typed, f"{name} has no TYPE before its samples"
        labels: dict[str, str] = {}
        rest = raw_labels or ""
        while rest:
            label = LABEL.match(rest)
            assert label, f"bad labels in {line!r}"
            labels[label.group(1)] = _unescape(label.group(2))
            rest = rest[label.end() :]
        key = (name, frozenset(labels.items()))
        assert key not in samples, f"duplicate series {line!r}"
        samples[key] = float(value)
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def scrape(client, **headers):
    return client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", **headers)


def test_a_scrape_reports_buffers_tasks_waiting_reasons_trains_and_work(client, token, clock) -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=5, planned_buffer_hosts=3, failure_buffer_hosts=2)
    make_train(pool)
    operation = operation_submit(
        kind="upgrade",
        component="gpu-driver",
        version="560.35.03",
        scope=f"pool {pool.name}",
        reason="driver rollout",
        drainer="external",
    )
    pool_tick(pool_id=pool.pk, kick=False)
    waiting = dict(
        HostTask.objects.filter(operation=operation, state=TaskState.PENDING)
        .values_list("waiting_code")
        .annotate(n=Count("id"))
    )
    assert waiting == {WaitingCode.PLANNED_BUFFER: 7}

    response = scrape(client)

    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    samples = parse(response.content.decode())
    p = pool.name
    assert value(samples, "opsplanner_pool_hosts", pool=p, state="draining") == 3
    assert value(samples, "opsplanner_pool_hosts", pool=p, state="in_service") == 7
    assert value(samples, "opsplanner_pool_in_service_hosts", pool=p) == 7
    assert value(samples, "opsplanner_pool_planned_out_hosts", pool=p) == 3
    assert value(samples, "opsplanner_pool_failure_out_hosts", pool=p) == 0
    assert value(samples, "opsplanner_pool_planned_buffer_hosts", pool=p) == 3
    assert value(samples, "opsplanner_pool_failure_buffer_hosts", pool=p) == 2
    assert value(samples, "opsplanner_pool_floor_hosts", pool=p) == 5
    assert value(samples, "opsplanner_pool_reserved_hosts", pool=p) == 0
    assert value(samples, "opsplanner_host_tasks", pool=p, state="draining") == 3
    assert value(samples, "opsplanner_host_tasks", pool=p, state="pending") == 7
    assert value(samples, "opsplanner_host_tasks", pool=p, state="admitted") == 0
    assert value(samples, "opsplanner_pending_tasks", pool=p, waiting_code="planned_buffer") == 7
    assert value(samples, "opsplanner_pending_tasks", pool=p, waiting_code="floor") == 0
    assert value(samples, "opsplanner_pending_tasks", pool=p, waiting_code="none") == 0
    assert value(samples, "opsplanner_trains", pool=p, state="running") == 1
    assert value(samples, "opsplanner_trains", pool=p, state="paused") == 0
    assert value(samples, "opsplanner_recent_task_admissions", pool=p) == 3
    assert value(samples, "opsplanner_recent_window_seconds") == 900
    drains = {"kind": "drain", "adapter": "external"}
    assert value(samples, "opsplanner_work_items", state="ready", **drains) == 3
    assert value(samples, "opsplanner_work_items", state="running", **drains) == 0
    assert value(samples, "opsplanner_work_item_oldest_ready_age_seconds", **drains) == 0

    # The drainer claims the three drains 30 s later and reports 60 s after that: one refused.
    clock.advance(30)
    items = work_items_claim(worker="drainer-1", kinds=[WorkKind.DRAIN], limit=10)
    assert len(items) == 3
    clock.advance(60)
    for number, item in enumerate(items):
        outcome = WorkState.FAILED if number == 0 else WorkState.DONE
        work_item_report(item_id=item.pk, worker="drainer-1", key=f"k{item.pk}", outcome=outcome, reason="refused")
    clock.advance(5)
    pool_tick(pool_id=pool.pk, kick=False)
    failed = HostTask.objects.filter(operation=operation, state=TaskState.FAILED).count()
    assert failed == 1

    samples = parse(scrape(client).content.decode())

    assert value(samples, "opsplanner_recent_task_failures", pool=p, operation_kind="upgrade") == 1
    assert value(samples, "opsplanner_recent_task_failures", pool=p, operation_kind="reboot") == 0
    assert value(samples, "opsplanner_recent_work_items_finished", outcome="done", **drains) == 2
    assert value(samples, "opsplanner_recent_work_items_finished", outcome="failed", **drains) == 1
    assert value(samples, "opsplanner_recent_work_item_wait_mean_seconds", **drains) == 30
    assert value(samples, "opsplanner_recent_work_item_wait_max_seconds", **drains) == 30
    assert value(samples, "opsplanner_recent_work_item_run_mean_seconds", **drains) == 60
    assert value(samples, "opsplanner_recent_work_item_run_max_seconds", **drains) == 60
    executes = WorkItem.objects.filter(kind=WorkKind.EXECUTE, state=WorkState.READY).count()
    assert executes == 2
    assert value(samples, "opsplanner_work_items", kind="execute", adapter="simulated", state="ready") == executes
    assert (
        "opsplanner_recent_work_item_wait_mean_seconds",
        frozenset({"kind": "execute", "adapter": "simulated"}.items()),
    ) not in samples

    # Twenty minutes on, the window has moved past all of it; the queue's age has grown.
    clock.advance(20 * 60)
    samples = parse(scrape(client).content.decode())
    assert value(samples, "opsplanner_recent_task_admissions", pool=p) == 0
    assert value(samples, "opsplanner_recent_task_failures", pool=p, operation_kind="upgrade") == 0
    assert value(samples, "opsplanner_recent_work_items_finished", outcome="done", **drains) == 0
    assert value(
        samples, "opsplanner_work_item_oldest_ready_age_seconds", kind="execute", adapter="simulated"
    ) == pytest.approx(20 * 60)


def test_worker_heartbeats_are_ages_and_names_are_escaped(client, token, clock, settings) -> None:
    settings.WORKER_HEARTBEAT_SECONDS = 15
    WorkerHeartbeat.objects.create(worker="celery@web-1", last_seen_at=T0 - dt.timedelta(seconds=10), pid=1)
    odd = 'celery@"odd"\\name'
    WorkerHeartbeat.objects.create(worker=odd, last_seen_at=T0 - dt.timedelta(seconds=100), pid=2)

    response = scrape(client)

    assert 'worker="celery@\\"odd\\"\\\\name"' in response.content.decode()
    samples = parse(response.content.decode())
    assert value(samples, "opsplanner_worker_heartbeat_age_seconds", worker="celery@web-1") == 10
    assert value(samples, "opsplanner_worker_heartbeat_age_seconds", worker=odd) == 100
    assert value(samples, "opsplanner_workers_live") == 1


def test_render_escapes_help_and_label_values_and_formats_special_values() -> None:
    family = MetricFamily("x_metric", "line one\nback\\slash")
    family.add(1.5, a='q"uote', b="new\nline", c="back\\slash")
    family.add(float("inf"), a="")
    family.add(float("nan"))

    text = render([family])

    assert text.splitlines() == [
        "# HELP x_metric line one\\nback\\\\slash",
        "# TYPE x_metric gauge",
        'x_metric{a="q\\"uote",b="new\\nline",c="back\\\\slash"} 1.5',
        'x_metric{a=""} +Inf',
        "x_metric NaN",
    ]
    assert parse(text)[("x_metric", frozenset({"a": 'q"uote', "b": "new\nline", "c": "back\\slash"}.items()))] == 1.5


def test_the_number_of_queries_does_not_grow_with_the_fleet(client, token, django_assert_max_num_queries) -> None:
    def one_fleet() -> None:
        pool, _ = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=2)
        make_train(pool)
        operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="kernel parameters")
        pool_tick(pool_id=pool.pk, kick=False)

    one_fleet()
    with django_assert_max_num_queries(MAX_QUERIES), CaptureQueriesContext(connection) as small:
        assert scrape(client).status_code == 200
    for _ in range(3):
        one_fleet()
    with CaptureQueriesContext(connection) as large:
        response = scrape(client)
    assert response.status_code == 200
    assert len(large) == len(small)
    assert len({key[1] for key in parse(response.content.decode()) if key[0] == "opsplanner_pool_hosts"}) == 4 * len(
        HostState.values
    )


# --- who may read it --------------------------------------------------------------------------------
def test_anonymous_requests_are_refused_without_numbers(client, token) -> None:
    make_fleet(domains=1, hosts_per_domain=1)

    response = client.get("/metrics")

    assert response.status_code == 401
    assert response["Content-Type"].startswith("text/plain")
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"authentication required" in response.content
    assert b"opsplanner_" not in response.content


@pytest.mark.parametrize("header", [f"Bearer {TOKEN}x", "Bearer ", f"Bearer {TOKEN[:-1]}", "Bearer wrong"])
def test_a_wrong_token_is_refused(client, token, header) -> None:
    response = client.get("/metrics", HTTP_AUTHORIZATION=header)

    assert response.status_code == 401
    assert response.content == b"invalid metrics token\n"


def test_the_token_is_accepted_whatever_the_case_of_the_scheme(client, token) -> None:
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"bearer {TOKEN}").status_code == 200


def test_no_token_is_accepted_when_none_is_configured(client, settings) -> None:
    settings.METRICS_TOKEN = ""

    for header in ("Bearer ", "Bearer anything-at-all-long-enough"):
        assert client.get("/metrics", HTTP_AUTHORIZATION=header).status_code == 401


@pytest.mark.parametrize(
    ("role", "status"), [(Role.OPERATOR, 200), (Role.VIEWER, 200), (Role.EXECUTOR, 403), ("", 403)]
)
def test_logged_in_users_may_read_it_when_their_role_may_see_the_fleet(client, role, status) -> None:
    user = make_user(role) if role else make_user("no-such-role")
    client.force_login(user)

    response = client.get("/metrics")

    assert response.status_code == status
    if status == 403:
        assert response.content == b"your role may not read metrics\n"
    else:
        assert b"# TYPE opsplanner_pool_hosts gauge" in response.content


def test_only_get_is_answered(client, token) -> None:
    assert client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


def test_a_scrape_counts_each_pools_upgrades_by_how_their_promise_stands(client, token, clock) -> None:
    from fleet.models import Component
    from tests.builders import make_version
    from trains.models import Upgrade, UpgradeState
    from trains.services.upgrades import upgrade_create

    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    make_train(pool, cycle_slo_s=7200)
    for version in ("2.18.0", "2.20.0", "2.22.0"):
        make_version(Component.objects.get(name="bios"), version)
    pending, overdue, kept, missed, old = (
        upgrade_create(pool=pool, component=c, version=v, reason="rollout")
        for c, v in [("bios", "2.16.0"), ("gpu-driver", "560.35.03"), ("bios", "2.18.0"), ("bios", "2.20.0"),
                     ("bios", "2.22.0")]
    )  # fmt: skip
    hour = dt.timedelta(hours=1)
    Upgrade.objects.filter(pk=overdue.pk).update(promised_at=T0 - hour)
    Upgrade.objects.filter(pk=kept.pk).update(state=UpgradeState.COMPLETED, promised_at=T0, finished_at=T0 - hour)
    Upgrade.objects.filter(pk=missed.pk).update(state=UpgradeState.COMPLETED, promised_at=T0 - 2 * hour,
                                                finished_at=T0 - hour)  # fmt: skip
    # Completed more than a week ago: no longer counted.
    Upgrade.objects.filter(pk=old.pk).update(state=UpgradeState.COMPLETED, finished_at=T0 - dt.timedelta(days=8))

    samples = parse(scrape(client).content.decode())

    p = pool.name
    assert Upgrade.objects.get(pk=pending.pk).promised_at > T0
    counted = {s: value(samples, "opsplanner_upgrade_promises", pool=p, promise=s) for s in
               ["pending", "overdue", "kept", "missed", "none", "beyond_horizon", "ended"]}  # fmt: skip
    assert counted == {"pending": 1, "overdue": 1, "kept": 1, "missed": 1, "none": 0, "beyond_horizon": 0, "ended": 0}
