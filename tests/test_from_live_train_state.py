"""What-if on the live fleet: a train paused or autostopped live is played so in the forecast (it was
recreated running, and the forecast promised progress the live fleet will not make), and the
forecast says so. The lanes run in this process, on the test database, so each forecast takes seconds."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils.html import escape

from fleet.models import Pool
from opsplanner import clock
from opsplanner.models import AdvisorRun, AdvisorRunState, Event
from opsplanner.models.advisor import AdvisorRunKind
from opsplanner.roles import Role
from simulation import from_live
from simulation.config import SimulationConfig
from simulation.from_live import live_snapshot
from simulation.policies import TrainsPolicy
from simulation.report import report_text
from simulation.world import SimPool, World
from tests.advisor_helpers import client_for, run_section
from tests.api_helpers import role_client
from tests.builders import make_fleet
from tests.from_live_helpers import forecast, policy
from tests.trains_builders import make_user
from trains.models import Train, TrainState, Visit

pytestmark = pytest.mark.django_db


def live_pool(*, auto_resume_after_s: int | None = None) -> Pool:
    """2 racks of 3 hosts, a train (24 h SLO) and a pending upgrade of bios to 2.16.0 on every host."""
    from trains.services.trains import train_create
    from trains.services.upgrades import upgrade_create

    pool, _ = make_fleet(domains=2, hosts_per_domain=3, failure_buffer_hosts=1, pool_name="live-t")
    train_create(
        pool=pool, name="train-live-t", cycle_slo_s=24 * 3600, visit_estimate_s=3600,
        auto_resume_after_s=auto_resume_after_s, actor="test",
    )  # fmt: skip
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="firmware fix", actor="test")
    return pool


def paused(pool: Pool) -> None:
    from trains.services.trains import train_pause

    train_pause(train_id=Train.objects.get(pool=pool).pk, reason="change freeze", actor="test")


def autostopped(pool: Pool, *, recovered_since: dt.datetime | None = None) -> None:
    """As the train tick stops it when a buffer is exhausted."""
    from trains.services.trains import train_set_state

    train = Train.objects.get(pool=pool)
    reason = "failure buffer of pool live-t exhausted"
    train_set_state(
        train=train, expected={TrainState.RUNNING}, new=TrainState.AUTOSTOPPED, reason=reason, actor="test",
        kind="train.autostopped",
    )  # fmt: skip
    if recovered_since is not None:
        Train.objects.filter(pk=train.pk).update(recovered_since=recovered_since)


def test_it_snapshots_the_live_trains_state_and_how_it_resumes() -> None:
    pool = live_pool(auto_resume_after_s=1800)
    recovered = clock.now().replace(microsecond=0) - dt.timedelta(minutes=10)
    autostopped(pool, recovered_since=recovered)

    (snapshot,) = live_snapshot(pool.name, clock.now())

    (train,) = snapshot["trains"]
    assert train["state"] == "autostopped"
    assert train["state_reason"] == "failure buffer of pool live-t exhausted"
    assert train["auto_resume_after_s"] == 1800
    assert train["recovered_since"] == recovered.isoformat()


def test_it_forecasts_no_host_reached_for_a_pending_upgrade_whose_live_train_is_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    paused(live_pool())

    result = forecast(monkeypatch, Pool.objects.get(name="live-t"))

    trains = policy(result, "trains")
    (upgrade,) = trains["upgrades"]
    assert (upgrade["component"], upgrade["version"]) == ("bios", "2.16.0")
    assert upgrade["reach_24h"] == 0
    assert upgrade["full_rollout_hours"] is None
    assert trains["measures"]["drains"] == 0
    assert Train.objects.get().state == TrainState.PAUSED  # the lane's train, at the forecast's end


def test_it_forecasts_the_same_upgrade_reaching_hosts_when_the_live_train_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live_pool()

    result = forecast(monkeypatch, Pool.objects.get(name="live-t"))

    (upgrade,) = policy(result, "trains")["upgrades"]
    assert upgrade["reach_24h"] > 0
    assert result["notes"] == []  # nothing to say of a running train


def test_it_keeps_an_autostopped_train_that_does_not_resume_on_its_own_stopped_all_forecast(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    autostopped(live_pool(auto_resume_after_s=None))

    result = forecast(monkeypatch, Pool.objects.get(name="live-t"))

    (upgrade,) = policy(result, "trains")["upgrades"]
    assert upgrade["reach_24h"] == 0
    assert Train.objects.get().state == TrainState.AUTOSTOPPED
    # The lane's copy of the live stop is not an autostop of the forecast.
    assert policy(result, "trains")["measures"]["drains"] == 0
    assert result["summary"]["totals"]["trains"]["autostops"] == 0


def test_it_resumes_an_autostopped_train_once_the_buffers_have_recovered_for_its_delay_as_live(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    autostopped(live_pool(auto_resume_after_s=2 * 3600))

    result = forecast(monkeypatch, Pool.objects.get(name="live-t"))

    start = dt.datetime.fromisoformat(result["start_at"])
    (upgrade,) = policy(result, "trains")["upgrades"]
    assert upgrade["reach_24h"] == 1.0  # resumed within the day, then visited both racks
    first_visit = Visit.objects.order_by("started_at").values_list("started_at", flat=True).first()
    assert first_visit is not None
    assert first_visit >= start + dt.timedelta(hours=2)
    # The lane looks again when the countdown ends, not at its next idle step (6 h later at worst).
    assert first_visit <= start + dt.timedelta(hours=2, minutes=5)
    assert Event.objects.filter(kind="train.resumed", reason="buffers recovered for 7200 s").count() == 1


def test_it_says_in_the_result_and_the_report_that_the_forecast_plays_the_train_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    paused(live_pool())

    result = forecast(monkeypatch, Pool.objects.get(name="live-t"), "trains", "rolling")

    (trains_note,) = policy(result, "trains")["notes"]
    assert trains_note.startswith("train train-live-t is paused on the live fleet (change freeze): ")
    assert "the forecast plays it paused for the whole forecast (1 day)" in trains_note
    (rolling_note,) = policy(result, "rolling")["notes"]
    assert "this policy runs no train and rolls the pending upgrades all the same" in rolling_note
    assert result["notes"] == [trains_note, rolling_note]
    text = " ".join(report_text(result["summary"]).split())  # the report wraps a note over lines
    assert f"Note (trains): {trains_note}" in text
    assert f"Note (rolling): {rolling_note}" in text


def one_pool_world(pool: Pool) -> World:
    hosts = list(pool.hosts.order_by("hostname").values_list("id", flat=True))
    return World(pools=[SimPool(id=pool.pk, name=pool.name, number=0, host_ids=hosts, domain_ids=[])])


def lane_train(pool: Pool, spec: dict[str, Any]) -> Train:
    """The lane's copy of a snapshot's train (the live one deleted to make way for it)."""
    Train.objects.filter(pool=pool).delete()
    world = one_pool_world(pool)
    world.trains[pool.pk] = [from_live.live_train_spec(spec)]
    TrainsPolicy(SimulationConfig(hosts=6, pools=1, hosts_per_domain=3), world).setup()
    return Train.objects.get()


def test_it_goes_on_with_the_live_countdown_to_an_automatic_resumption() -> None:
    pool = live_pool(auto_resume_after_s=1800)
    recovered = clock.now().replace(microsecond=0) - dt.timedelta(minutes=10)
    autostopped(pool, recovered_since=recovered)
    (spec,) = live_snapshot(pool.name, clock.now())[0]["trains"]

    copy = lane_train(pool, spec)

    assert (copy.state, copy.auto_resume_after_s, copy.recovered_since) == (TrainState.AUTOSTOPPED, 1800, recovered)


def test_it_reads_a_snapshot_from_before_train_states_as_a_running_train_resuming_after_an_hour() -> None:
    pool = live_pool()
    (spec,) = live_snapshot(pool.name, clock.now())[0]["trains"]
    older = {key: value for key, value in spec.items() if key not in ("state", "state_reason",
             "auto_resume_after_s", "recovered_since")}  # fmt: skip

    copy = lane_train(pool, older)

    assert (copy.state, copy.auto_resume_after_s, copy.recovered_since) == (TrainState.RUNNING, 3600, None)


def test_the_advisor_page_and_the_api_show_the_forecasts_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    paused(live_pool())
    result = forecast(monkeypatch, Pool.objects.get(name="live-t"))
    (note,) = result["notes"]
    run = AdvisorRun.objects.create(
        kind=AdvisorRunKind.LIVE_FORECAST, params={"pool": "live-t", "days": 1, "policies": ["trains"], "seed": 1},
        state=AdvisorRunState.DONE, result=result, requester="test", finished_at=clock.now(),
    )  # fmt: skip

    section = run_section(client_for(make_user(Role.VIEWER)).get("/simulations/advisor/").content.decode(), run)
    api = role_client(Role.VIEWER).get(f"/api/advisor-runs/{run.pk}/").json()
    schema = role_client(Role.VIEWER).get("/api/schema/", {"format": "json"}).json()["components"]["schemas"]

    assert f'<p class="forecast-note">{escape(note)}</p>' in section
    assert api["forecast"]["notes"] == [note]
    assert api["forecast"]["policies"][0]["notes"] == [note]
    assert "notes" in schema["LiveForecastResult"]["properties"]
    assert "notes" in schema["LiveForecastPolicy"]["properties"]
