"""What-if on the live fleet as an advisor run: the API and the page queue a live forecast of one pool,
the worker's execution (advisor_run_execute, called directly as the Celery task does) forecasts it in
scratch databases and writes nothing to the live database but the run's row and events."""

from __future__ import annotations

import re

import pytest
from django.db import connection

from opsplanner.models import AdvisorRun, AdvisorRunState, Event
from opsplanner.roles import Role
from simulation import advisor_runs
from simulation.advisor_runs import advisor_live_forecast_request, advisor_run_execute
from tests.advisor_helpers import client_for, run_section
from tests.api_helpers import role_client
from tests.builders import make_fleet
from tests.test_simulation_from_live import live_pool, shards_that_fail, table_counts
from tests.trains_builders import make_user

URL = "/api/advisor-runs/"
PAGE = "/simulations/advisor/"
LIVE = {"kind": "live_forecast", "pool": "live-a", "days": 2}


def run_events(run: AdvisorRun) -> list[str]:
    rows = Event.objects.filter(subject_type="opsplanner.advisorrun", subject_id=run.pk).order_by("id")
    return list(rows.values_list("kind", flat=True))


def events_checksum_without_run(run_id: int | None) -> str:
    """The event table's checksum, leaving out the events about advisor run `run_id`."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT md5(coalesce(string_agg(e::text, '|' ORDER BY e.id), '')) FROM opsplanner_event e "
            "WHERE NOT (e.subject_type = 'opsplanner.advisorrun' AND e.subject_id IS NOT DISTINCT FROM %s)",
            [run_id],
        )
        return cursor.fetchone()[0]


# The API -------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({**LIVE, "pool": "nope"}, "pool", "There is no pool named 'nope'."),
        ({**LIVE, "pool": "live-empty"}, "pool", "Pool 'live-empty' has no hosts to forecast."),
        ({**LIVE, "days": 0}, "days", "Forecast 1 to 30 days"),
        ({**LIVE, "days": 31}, "days", "Forecast 1 to 30 days"),
        ({**LIVE, "policies": ["trains", "fastest"]}, "policies", "Unknown policy 'fastest'"),
        ({**LIVE, "policies": []}, "policies", "at least one policy"),
        ({**LIVE, "policies": ["rolling", "rolling"]}, "policies", "each policy once"),
        ({**LIVE, "kind": "horoscope"}, "kind", "not a valid choice"),
        ({"kind": "live_forecast", "days": 2}, "pool", "required"),
        ({**LIVE, "seed": 2**31}, "seed", "Seed must be a number from 0 to 2,147,483,647."),
        ({**LIVE, "seed": -1}, "seed", "Seed must be a number from 0 to 2,147,483,647."),
    ],
)
def test_the_api_refuses_a_bad_live_forecast_by_field_and_writes_nothing(body, field, words, enqueued) -> None:
    live_pool()
    events = Event.objects.count()
    response = role_client(Role.OPERATOR).post(URL, body, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert words in " ".join(m for key, ms in errors.items() if key.split(".")[0] == field for m in ms), errors
    assert not AdvisorRun.objects.exists()
    assert Event.objects.count() == events
    assert enqueued == []


def too_fast_a_train(name: str = "live-fast") -> str:
    """A pool whose train promises a cycle (30 minutes) shorter than its 4 racks can take."""
    from trains.services.trains import train_create

    pool, _ = make_fleet(domains=4, hosts_per_domain=5, failure_buffer_hosts=1, pool_name=name)
    train_create(pool=pool, name=f"train-{name}", cycle_slo_s=1800, visit_estimate_s=450, actor="test")
    return name


@pytest.mark.django_db
def test_the_api_and_the_form_refuse_a_pool_whose_train_the_forecast_cannot_simulate(enqueued) -> None:
    name = too_fast_a_train()

    response = role_client(Role.OPERATOR).post(URL, {**LIVE, "pool": name}, format="json")
    form = client_for(make_user(Role.OPERATOR)).post(
        PAGE, {"kind": "live_forecast", "live-pool": name, "live-days": 1, "live-policies": ["trains"]}
    )

    assert response.status_code == 400, response.content
    (message,) = response.json()["errors"]["pool"]
    assert message.startswith(f"Pool '{name}' cannot be forecast: A cycle of 4 domains")
    assert "cannot be met" in message
    assert form.status_code == 400
    field = re.search(r'data-field="live-pool">.*?data-field="live-days"', form.content.decode(), re.S)
    assert field
    assert "cannot be met" in field.group(0)
    assert not AdvisorRun.objects.exists()
    assert enqueued == []


@pytest.mark.django_db
def test_a_live_pool_larger_than_a_run_may_simulate_is_refused_by_name(enqueued, monkeypatch) -> None:
    live_pool()
    monkeypatch.setattr(advisor_runs, "MAX_POOL_HOSTS", 10)
    response = role_client(Role.OPERATOR).post(URL, LIVE, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["errors"]["pool"] == ["Pool 'live-a' has more than 10 hosts, too many to forecast here."]
    assert not AdvisorRun.objects.exists()


@pytest.mark.django_db
def test_an_operators_post_queues_a_live_forecast_of_the_train_paces_and_rolling_by_default(
    enqueued, django_capture_on_commit_callbacks
) -> None:
    live_pool()
    operator = role_client(Role.OPERATOR)
    with django_capture_on_commit_callbacks(execute=True):
        response = operator.post(URL, LIVE, format="json")
    assert response.status_code == 202, response.content
    body = response.json()
    run = AdvisorRun.objects.get()
    assert body["id"] == run.pk
    assert body["kind"] == "live_forecast"
    assert body["state"] == "queued"
    assert body["forecast"] is None
    assert run.params == {"pool": "live-a", "days": 2, "policies": ["trains", "trains-sliding", "rolling"], "seed": 1}
    assert enqueued == [run.pk]
    assert run_events(run) == ["advisor_run.requested"]
    assert role_client(Role.VIEWER).post(URL, LIVE, format="json").status_code == 403


@pytest.mark.django_db
def test_a_live_forecast_waits_for_the_one_active_run_like_any_advisor_run(enqueued) -> None:
    live_pool()
    operator = role_client(Role.OPERATOR)
    first = operator.post(URL, LIVE, format="json").json()["id"]
    refused = operator.post(
        URL, {"pool_hosts": 400, "sizes": [16, 40], "interruption_cost": 1, "capacity_hour_cost": 1}, format="json"
    )
    assert refused.status_code == 409
    assert f"try again when run #{first} finishes" in refused.json()["detail"]


@pytest.mark.django_db
def test_the_schema_documents_the_live_forecast_request_and_result() -> None:
    schema = role_client(Role.OPERATOR).get("/api/schema/", {"format": "json"}).json()
    components = schema["components"]["schemas"]
    assert set(components["LiveForecastInputRequest"]["properties"]) == {"kind", "pool", "days", "policies", "seed"}
    assert set(components["NewAdvisorRunRequest"]["discriminator"]["mapping"]) == {"domain_size", "live_forecast"}
    assert "forecast" in components["AdvisorRun"]["properties"]
    assert "full_rollout_hours" in components["LiveForecastUpgrade"]["properties"]


# The worker's execution -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # the forecast creates scratch databases: no enclosing transaction
def test_a_live_forecast_run_ends_done_with_its_measures_and_leaves_the_live_database_unchanged(enqueued) -> None:
    name = live_pool()
    operator = make_user(Role.OPERATOR)
    counts, checksum = table_counts(), events_checksum_without_run(None)

    run = advisor_live_forecast_request(pool=name, days=1, policies=["rolling", "trains"], actor=operator)
    advisor_run_execute(run_id=run.pk)

    run.refresh_from_db()
    assert run.state == AdvisorRunState.DONE, run.failure_reason
    after = table_counts()
    assert after.pop("opsplanner_advisorrun") == counts.pop("opsplanner_advisorrun") + 1
    assert after.pop("opsplanner_event") == counts.pop("opsplanner_event") + 3
    assert after == counts
    assert events_checksum_without_run(run.pk) == checksum
    assert run_events(run) == ["advisor_run.requested", "advisor_run.started", "advisor_run.done"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_database WHERE datname LIKE %s", [f"%_advisor{run.pk}_%_sim"])
        assert cursor.fetchone()[0] == 0  # the scratch databases are gone

    result = run.result
    assert result is not None
    assert result["pool"] == name
    assert result["hosts"] == 20
    assert [row["policy"] for row in result["policies"]] == ["trains", "rolling"]
    trains, rolling = result["policies"]
    assert trains["measures"]["drains"] == 20  # one drain per host: the live train's one cycle
    assert trains["measures"]["drains_per_host"] == 1.0
    assert trains["measures"]["cycles_missed_slo"] is not None
    assert rolling["measures"]["cycles_missed_slo"] is None  # no cycles without trains
    for row in result["policies"]:
        assert row["measures"]["violations"] == 0, row["policy"]
        (upgrade,) = row["upgrades"]
        assert (upgrade["component"], upgrade["version"]) == ("bios", "2.16.0")
        assert upgrade["full_rollout_hours"] is not None, row["policy"]  # 20 hosts are done within the day
        assert upgrade["reach_24h"] == 1.0, row["policy"]

    api = role_client(Role.VIEWER).get(f"{URL}{run.pk}/").json()
    assert api["kind"] == "live_forecast"
    assert [row["policy"] for row in api["forecast"]["policies"]] == ["trains", "rolling"]
    section = run_section(client_for(make_user(Role.VIEWER)).get(PAGE).content.decode(), run)
    assert f"live forecast · pool {name} · 1 day · trains, rolling" in section
    assert '<tr data-policy="trains">' in section
    assert '<tr data-policy="rolling">' in section
    assert "bios 2.16.0" in section
    assert "hx-trigger" not in section  # done: no more polling


@pytest.mark.django_db
def test_a_live_forecast_of_a_pool_gone_since_the_request_fails_with_the_reason(enqueued) -> None:
    name = live_pool()
    run = advisor_live_forecast_request(pool=name, days=1, actor=make_user(Role.OPERATOR))
    AdvisorRun.objects.filter(pk=run.pk).update(params={**run.params, "pool": "renamed"})

    advisor_run_execute(run_id=run.pk)

    run.refresh_from_db()
    assert run.state == AdvisorRunState.FAILED
    assert run.failure_reason == "LiveSnapshotError: there is no pool named 'renamed'"
    html = client_for(make_user(Role.VIEWER)).get(PAGE).content.decode()
    assert "Failed: LiveSnapshotError: there is no pool named" in run_section(html, run)


@pytest.mark.django_db
def test_a_live_forecast_whose_shard_fails_stores_the_shards_own_error_as_the_reason(
    enqueued, monkeypatch, tmp_path
) -> None:
    name = live_pool()
    run = advisor_live_forecast_request(pool=name, days=1, policies=["trains"], actor=make_user(Role.OPERATOR))
    shards_that_fail(monkeypatch, tmp_path, "ValidationError: the lane refused the upgrade")

    advisor_run_execute(run_id=run.pk)

    run.refresh_from_db()
    assert run.state == AdvisorRunState.FAILED
    assert run.failure_reason.startswith("ShardFailed: the trains shard (trains, pools 0) failed with exit 3")
    assert run.failure_reason.endswith(": ValidationError: the lane refused the upgrade")


# The page -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_only_operators_get_the_live_forecast_form(enqueued) -> None:
    live_pool()
    viewer = client_for(make_user(Role.VIEWER))
    assert 'name="live-pool"' not in viewer.get(PAGE).content.decode()
    assert viewer.post(PAGE, {"kind": "live_forecast", "live-pool": "live-a", "live-days": 1}).status_code == 403
    assert not AdvisorRun.objects.exists()
    page = client_for(make_user(Role.OPERATOR)).get(PAGE).content.decode()
    assert 'name="live-pool"' in page
    assert 'name="live-policies" value="trains-sliding"' in page


@pytest.mark.django_db
def test_the_live_forecast_form_shows_an_unknown_pool_next_to_the_field_and_writes_nothing(enqueued) -> None:
    live_pool()
    operator = client_for(make_user(Role.OPERATOR))
    response = operator.post(
        PAGE, {"kind": "live_forecast", "live-pool": "nope", "live-days": 3, "live-policies": ["trains"]}
    )
    assert response.status_code == 400
    html = response.content.decode()
    field = re.search(r'data-field="live-pool">.*?data-field="live-days"', html, re.S)
    assert field, "no pool field"
    assert "There is no pool named &#x27;nope&#x27;." in field.group(0)
    assert 'value="nope"' in field.group(0)  # what was typed is kept
    assert not AdvisorRun.objects.exists()
    assert enqueued == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"live-days": "a week"}, "Enter a whole number."),
        ({"live-days": "99"}, "less than or equal to 30"),
        ({"live-policies": ["<b>fast</b>"]}, "Select a valid choice. &lt;b&gt;fast&lt;/b&gt; is not one"),
        ({"live-pool": ""}, "This field is required."),
        ({"live-pool": "x" * 300}, "at most 200 characters"),
    ],
)
def test_the_live_forecast_form_refuses_bad_input_with_the_reason(changes, words, enqueued) -> None:
    live_pool()
    data = {"kind": "live_forecast", "live-pool": "live-a", "live-days": "2", "live-policies": ["trains"], **changes}
    response = client_for(make_user(Role.OPERATOR)).post(PAGE, data)
    assert response.status_code == 400
    assert words in response.content.decode()
    assert not AdvisorRun.objects.exists()


@pytest.mark.django_db
def test_the_live_forecast_form_queues_a_run_and_shows_it_queued(enqueued, django_capture_on_commit_callbacks) -> None:
    live_pool()
    operator = client_for(make_user(Role.OPERATOR))
    with django_capture_on_commit_callbacks(execute=True):
        response = operator.post(
            PAGE,
            {"kind": "live_forecast", "live-pool": "live-a", "live-days": 3, "live-policies": ["rolling", "trains"]},
        )
    run = AdvisorRun.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"{PAGE}?run={run.pk}"
    assert run.kind == "live_forecast"
    assert run.params["policies"] == ["trains", "rolling"]
    assert run.params["days"] == 3
    assert enqueued == [run.pk]
    section = run_section(operator.get(response["Location"]).content.decode(), run)
    assert "Queued" in section
    assert "live forecast · pool live-a · 3 days · trains, rolling" in section
