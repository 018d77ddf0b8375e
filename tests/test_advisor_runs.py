"""The domain-size advisor as a queued run: the API, the page and the worker's execution, on PostgreSQL.

The execution test simulates for real: `manage.py simulate --shard` subprocesses in scratch databases
named after the test database (test_<db>_advisor<run id>_<lane>_sim), dropped afterwards."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection

from opsplanner import clock
from opsplanner.models import AdvisorRun, AdvisorRunState, Event
from opsplanner.roles import Role
from simulation import advisor_runs
from simulation.advisor_runs import advisor_run_execute, advisor_run_request
from tests.advisor_helpers import client_for, run_section
from tests.api_helpers import role_client
from tests.trains_builders import make_user

URL = "/api/advisor-runs/"
PAGE = "/simulations/advisor/"
HTMX = {"HTTP_HX_REQUEST": "true"}
GOOD = {"pool_hosts": 400, "sizes": [16, 40, 80], "interruption_cost": 100, "capacity_hour_cost": 1.5}
TINY = {
    "pool_hosts": 120,
    "sizes": [20, 40],
    "interruption_cost": 100.0,
    "capacity_hour_cost": 1.0,
    "cycle_slo_hours": 24,
    "hardware": {"host_failures_per_day": 0.0, "upgrade_failure_rate": 0.0, "verify_failure_rate": 0.0},
}


def advisor_events() -> list[str]:
    return list(
        Event.objects.filter(subject_type="opsplanner.advisorrun").order_by("id").values_list("kind", flat=True)
    )


# The API -------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({**GOOD, "sizes": ["sixteen"]}, "sizes", "valid integer"),
        ({**GOOD, "sizes": []}, "sizes", "at least one domain size"),
        ({**GOOD, "sizes": [0, 40]}, "sizes", "whole numbers of hosts, 1 or more"),
        ({**GOOD, "sizes": [40, 40]}, "sizes", "each domain size once"),
        ({**GOOD, "sizes": [500]}, "sizes", "does not fit in a pool of 400 hosts"),
        ({**GOOD, "interruption_cost": -1}, "interruption_cost", "from 0"),
        ({**GOOD, "capacity_hour_cost": -0.5}, "capacity_hour_cost", "from 0"),
        ({**GOOD, "pool_hosts": 20_001}, "pool_hosts", "1 to 20,000 hosts"),
        ({**GOOD, "upgrade_failure_rate": 0.9}, "upgrade_failure_rate", "below 0.5"),
        ({**GOOD, "job_hosts_min": 50, "job_hosts_max": 10}, "job_hosts_min", "cannot be larger"),
    ],
)
def test_the_api_refuses_bad_input_by_field_and_writes_nothing(body, field, words, enqueued) -> None:
    response = role_client(Role.OPERATOR).post(URL, body, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert words in " ".join(m for key, ms in errors.items() if key.split(".")[0] == field for m in ms), errors
    assert not AdvisorRun.objects.exists()
    assert advisor_events() == []
    assert enqueued == []


@pytest.mark.django_db
def test_a_viewer_cannot_queue_a_run_but_reads_them(enqueued) -> None:
    run = advisor_run_request(**GOOD, actor=make_user(Role.OPERATOR))
    viewer = role_client(Role.VIEWER)
    refused = viewer.post(URL, GOOD, format="json")
    assert refused.status_code == 403
    assert AdvisorRun.objects.count() == 1
    listed = viewer.get(URL)
    assert listed.status_code == 200
    assert [row["id"] for row in listed.json()["results"]] == [run.pk]
    detail = viewer.get(f"{URL}{run.pk}/")
    assert detail.status_code == 200
    assert detail.json()["state"] == "queued"
    assert role_client(Role.EXECUTOR).get(URL).status_code == 403


@pytest.mark.django_db
def test_an_operators_post_queues_a_run_and_hands_it_to_a_worker_after_the_commit(
    enqueued, django_capture_on_commit_callbacks
) -> None:
    operator = role_client(Role.OPERATOR)
    with django_capture_on_commit_callbacks(execute=True):
        response = operator.post(URL, {**GOOD, "sizes": [80, 16, 40], "drain_minutes": 20}, format="json")
    assert response.status_code == 202, response.content
    body = response.json()
    run = AdvisorRun.objects.get()
    assert body["id"] == run.pk
    assert body["state"] == "queued"
    assert body["recommended"] is None
    assert run.params["sizes"] == [16, 40, 80]
    assert run.params["pool_hosts"] == 400
    assert run.params["drain_minutes"] == 20.0
    assert run.params["upgrade_failure_rate"] == 0.005  # not given: the simulator's default, recorded
    assert run.requested_by == operator.user
    assert run.requester == operator.user.username
    assert enqueued == [run.pk]
    assert advisor_events() == ["advisor_run.requested"]


@pytest.mark.django_db
def test_a_second_run_while_one_is_active_is_refused_with_when_to_retry(enqueued) -> None:
    operator = role_client(Role.OPERATOR)
    first = operator.post(URL, GOOD, format="json").json()["id"]
    refused = operator.post(URL, GOOD, format="json")
    assert refused.status_code == 409
    assert refused.json()["code"] == "conflict"
    assert f"try again when run #{first} finishes" in refused.json()["detail"]
    assert AdvisorRun.objects.count() == 1
    AdvisorRun.objects.filter(pk=first).update(
        state=AdvisorRunState.FAILED, failure_reason="test", finished_at=clock.now()
    )
    assert operator.post(URL, GOOD, format="json").status_code == 202


@pytest.mark.django_db
def test_a_run_lost_for_hours_is_failed_and_frees_its_slot(enqueued) -> None:
    operator = make_user(Role.OPERATOR)
    long_ago = clock.now() - dt.timedelta(hours=13)
    with clock.use_clock(lambda: long_ago):
        lost = [advisor_run_request(**GOOD, actor=operator)]
    fresh = advisor_run_request(**GOOD, actor=operator)
    assert fresh.state == AdvisorRunState.QUEUED
    for run in lost:
        run.refresh_from_db()
        assert run.state == AdvisorRunState.FAILED
        assert run.failure_reason.startswith("abandoned")


@pytest.mark.django_db(transaction=True)  # the databases are dropped after the commit, outside any transaction
def test_a_killed_runs_scratch_databases_are_dropped_when_it_is_failed_as_abandoned(enqueued) -> None:
    operator = make_user(Role.OPERATOR)
    long_ago = clock.now() - dt.timedelta(hours=13)
    with clock.use_clock(lambda: long_ago):
        killed = advisor_run_request(**GOOD, actor=operator)
    AdvisorRun.objects.filter(pk=killed.pk).update(state=AdvisorRunState.RUNNING, started_at=long_ago)
    base = connection.settings_dict["NAME"]
    leftovers = [f"{base}_advisor{killed.pk}_{lane}_sim" for lane in (0, 1)]
    another_runs = f"{base}_advisor{killed.pk}0_0_sim"  # run #N0's lane: not the killed run's

    def scratch() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE %s ORDER BY 1", [f"{base}_advisor%"])
            return [name for (name,) in cursor.fetchall()]

    with connection.cursor() as cursor:
        for name in [*leftovers, another_runs]:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')
            cursor.execute(f'CREATE DATABASE "{name}"')
    try:
        assert scratch() == sorted([*leftovers, another_runs])
        advisor_run_request(**GOOD, actor=operator)
        killed.refresh_from_db()
        assert killed.state == AdvisorRunState.FAILED
        assert scratch() == [another_runs]
    finally:
        with connection.cursor() as cursor:
            for name in [*leftovers, another_runs]:
                cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')


# The worker's execution -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # the sweep creates scratch databases: no enclosing transaction
@pytest.mark.slow
def test_a_tiny_run_ends_done_with_a_recommendation_shown_on_the_page(enqueued) -> None:
    operator = make_user(Role.OPERATOR)
    run = advisor_run_request(**TINY, actor=operator)
    assert enqueued == [run.pk]

    advisor_run_execute(run_id=run.pk)

    run.refresh_from_db()
    assert run.state == AdvisorRunState.DONE, run.failure_reason
    assert run.started_at is not None
    assert run.finished_at >= run.started_at
    assert run.result["recommended"] in (20, 40)
    assert [point["size"] for point in run.result["points"]] == [20, 40]
    assert all(point["cost"] is not None for point in run.result["points"])
    assert advisor_events() == ["advisor_run.requested", "advisor_run.started", "advisor_run.done"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_database WHERE datname LIKE %s", [f"%_advisor{run.pk}_%_sim"])
        assert cursor.fetchone()[0] == 0  # the scratch databases are gone

    # Delivered again (late acks, a worker lost): nothing changes.
    finished_at = run.finished_at
    advisor_run_execute(run_id=run.pk)
    run.refresh_from_db()
    assert run.state == AdvisorRunState.DONE
    assert run.finished_at == finished_at
    assert len(advisor_events()) == 3

    viewer = client_for(make_user(Role.VIEWER))
    html = viewer.get(PAGE).content.decode()
    section = run_section(html, run)
    assert "<svg" in section
    assert f"Recommended: <strong>{run.result['recommended']} hosts per domain</strong>" in section
    assert "hx-trigger" not in section  # done: no more polling
    polled = viewer.get(PAGE, {"run": run.pk}, **HTMX)
    assert polled.status_code == 200
    assert polled.content.decode().lstrip().startswith("<section")  # the run's partial alone
    assert "hx-trigger" not in polled.content.decode()


@pytest.mark.django_db
def test_a_run_that_cannot_be_simulated_fails_with_the_reason(enqueued, monkeypatch) -> None:
    run = advisor_run_request(**GOOD, actor=make_user(Role.OPERATOR))

    def broken(*args, **kwargs):
        raise RuntimeError("migrating the scratch database failed")

    monkeypatch.setattr(advisor_runs, "scratch_databases", broken)
    advisor_run_execute(run_id=run.pk)
    run.refresh_from_db()
    assert run.state == AdvisorRunState.FAILED
    assert "migrating the scratch database failed" in run.failure_reason
    assert advisor_events() == ["advisor_run.requested", "advisor_run.started", "advisor_run.failed"]
    html = client_for(make_user(Role.VIEWER)).get(PAGE).content.decode()
    assert "Failed: RuntimeError: migrating the scratch database failed" in run_section(html, run)


# The page -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_queued_run_polls_itself_every_3_seconds(enqueued) -> None:
    run = advisor_run_request(**GOOD, actor=make_user(Role.OPERATOR))
    viewer = client_for(make_user(Role.VIEWER))
    section = run_section(viewer.get(PAGE).content.decode(), run)
    assert f'hx-get="{PAGE}?run={run.pk}"' in section
    assert 'hx-trigger="every 3s"' in section
    polled = viewer.get(PAGE, {"run": run.pk}, **HTMX).content.decode()
    assert 'hx-trigger="every 3s"' in polled
    assert "<html" not in polled
    assert viewer.get(PAGE, {"run": run.pk + 1000}, **HTMX).status_code == 404


@pytest.mark.django_db
def test_only_operators_get_the_form(enqueued) -> None:
    viewer = client_for(make_user(Role.VIEWER))
    page = viewer.get(PAGE)
    assert page.status_code == 200
    assert 'name="sizes"' not in page.content.decode()
    assert viewer.post(PAGE, {**GOOD, "sizes": "16, 40"}).status_code == 403
    assert not AdvisorRun.objects.exists()
    operator_page = client_for(make_user(Role.OPERATOR)).get(PAGE).content.decode()
    assert 'name="sizes"' in operator_page
    assert "csrfmiddlewaretoken" in operator_page
    executor = client_for(make_user(Role.EXECUTOR))
    assert executor.get(PAGE).status_code == 403


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("sizes", "words"),
    [
        ("16, forty", "whole numbers separated by commas"),
        ("16, 16", "Give each domain size once."),
        ("16, 900", "Size 900: A domain of 900 hosts does not fit in a pool of 400 hosts."),
    ],
)
def test_the_form_shows_bad_sizes_next_to_the_field_and_writes_nothing(sizes, words, enqueued) -> None:
    operator = client_for(make_user(Role.OPERATOR))
    response = operator.post(PAGE, {**GOOD, "sizes": sizes, "cycle_slo_hours": 72})
    assert response.status_code == 400
    html = response.content.decode()
    field = re.search(r'data-field="sizes">.*?data-field="interruption_cost"', html, re.S)
    assert field, "no sizes field"
    assert '<div class="field invalid" data-field="sizes">' in html
    assert words in field.group(0)
    assert f'value="{sizes}"' in field.group(0)  # what was typed is kept
    assert not AdvisorRun.objects.exists()
    assert enqueued == []


@pytest.mark.django_db
def test_the_form_queues_a_run_and_shows_it(enqueued, django_capture_on_commit_callbacks) -> None:
    operator = client_for(make_user(Role.OPERATOR))
    with django_capture_on_commit_callbacks(execute=True):
        response = operator.post(
            PAGE,
            {"pool_hosts": 400, "sizes": "80, 16, 40", "interruption_cost": 50, "capacity_hour_cost": 2,
             "cycle_slo_hours": 48},
        )  # fmt: skip
    run = AdvisorRun.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"{PAGE}?run={run.pk}"
    assert run.params["sizes"] == [16, 40, 80]
    assert run.params["cycle_slo_hours"] == 48.0
    assert enqueued == [run.pk]
    section = run_section(operator.get(response["Location"]).content.decode(), run)
    assert "Queued" in section
