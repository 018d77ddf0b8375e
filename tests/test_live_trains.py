"""The trains and upgrades pages over the live websocket: what the renderer sends on a resync and
when a pool or the approvals change, and pushes through the real ASGI application after a commit."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import transaction

from opsplanner.live import APPROVALS_GROUP, pool_group
from opsplanner.roles import Role
from tests.builders import make_fleet
from tests.test_live import connected, run, session_cookie
from tests.test_web_trains import offboarded_upgrade, train_with_a_skipped_domain
from tests.trains_builders import make_user
from trains.services.reonboarding import upgrade_reonboard_request
from trains.services.trains import train_pause
from trains.services.upgrades import upgrade_create
from trains.views.trains_pages import trains_live

UPGRADES = {"view": "upgrades"}


# --- the renderer -----------------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_resync_sends_the_whole_trains_list_and_a_pools_change_only_that_pools_trains() -> None:
    east, _ = train_with_a_skipped_domain()
    west, _ = train_with_a_skipped_domain()
    empty_pool, _ = make_fleet(domains=1, hosts_per_domain=1)
    viewer = make_user(Role.VIEWER)

    resync = trains_live(user=viewer, group=None, params={})
    east_changed = trains_live(user=viewer, group=pool_group(east.pool_id), params={})

    assert resync.startswith('<div id="trains-list" hx-swap-oob="innerHTML">')
    assert f'id="train-{east.pk}"' in resync
    assert f'id="train-{west.pk}"' in resync
    assert f'<div id="train-{east.pk}" class="train-status" data-state="running" hx-swap-oob="true">' in east_changed
    assert f'id="train-{west.pk}"' not in east_changed
    assert trains_live(user=viewer, group=pool_group(empty_pool.pk), params={}) == ""
    assert trains_live(user=viewer, group=APPROVALS_GROUP, params={}) == ""
    assert trains_live(user=viewer, group="pool-x", params={}) == ""


@pytest.mark.django_db
def test_live_fragments_need_no_request_and_give_a_viewer_no_forms() -> None:
    train, _ = train_with_a_skipped_domain()

    for_viewer = trains_live(user=make_user(Role.VIEWER), group=None, params={})
    for_operator = trains_live(user=make_user(Role.OPERATOR), group=None, params={})

    assert "train-actions" not in for_viewer
    assert f'hx-post="/trains/{train.pk}/pause/"' in for_operator
    assert "csrfmiddlewaretoken" not in for_operator  # HTMX sends the token from the body's hx-headers
    # A pool's push never carries the forms: a reason being typed survives it.
    assert "train-actions" not in trains_live(user=make_user(Role.OPERATOR), group=pool_group(train.pool_id), params={})


@pytest.mark.django_db
def test_the_train_page_gets_its_status_forecast_and_events_and_nothing_from_other_pools() -> None:
    train, skip_reason = train_with_a_skipped_domain()
    other, _ = train_with_a_skipped_domain()
    viewer = make_user(Role.VIEWER)
    params = {"train": str(train.pk)}

    resync = trains_live(user=viewer, group=None, params=params)
    changed = trains_live(user=viewer, group=pool_group(train.pool_id), params=params)

    for html in (resync, changed):
        assert f'<div id="train-{train.pk}" class="train-status"' in html
        assert f'<div id="train-{train.pk}-forecast" hx-swap-oob="innerHTML">' in html
        assert f'<div id="train-{train.pk}-events" hx-swap-oob="innerHTML">' in html
        assert skip_reason in html
    assert trains_live(user=viewer, group=pool_group(other.pool_id), params=params) == ""
    assert trains_live(user=viewer, group=None, params={"train": "999999"}) == ""
    assert trains_live(user=make_user(Role.EXECUTOR), group=None, params=params) == ""


@pytest.mark.django_db
def test_the_upgrades_page_gets_a_pools_upgrades_and_after_an_approval_change_the_offboarded_ones() -> None:
    offboarded = offboarded_upgrade()
    pool, _ = make_fleet()
    active = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    viewer = make_user(Role.VIEWER)

    resync = trains_live(user=viewer, group=None, params=UPGRADES)
    pool_changed = trains_live(user=viewer, group=pool_group(pool.pk), params=UPGRADES)
    approvals_changed = trains_live(user=viewer, group=APPROVALS_GROUP, params=UPGRADES)

    assert resync.startswith('<div id="upgrades-list" hx-swap-oob="innerHTML">')
    assert f'id="upgrade-{offboarded.pk}"' in resync
    assert f'id="upgrade-{active.pk}"' in resync
    assert f'id="upgrade-{active.pk}"' in pool_changed
    assert f'id="upgrade-{offboarded.pk}"' not in pool_changed
    assert f'id="upgrade-{offboarded.pk}"' in approvals_changed
    assert f'id="upgrade-{active.pk}"' not in approvals_changed
    assert trains_live(user=viewer, group=APPROVALS_GROUP, params={**UPGRADES, "state": "active"}) == ""
    detail = trains_live(user=viewer, group=None, params={"upgrade": str(offboarded.pk)})
    assert f'<div id="upgrade-{offboarded.pk}-events" hx-swap-oob="innerHTML">' in detail
    assert "upgrade.offboarded" in detail


# --- through the websocket --------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_viewer_watching_the_trains_page_sees_a_pause_pushed_after_the_commit() -> None:
    train, _ = train_with_a_skipped_domain()
    cookie = session_cookie(make_user(Role.VIEWER))
    operator = make_user(Role.OPERATOR)

    async def scenario() -> None:
        async with connected(cookie) as viewer:
            await viewer.send_to(text_data=json.dumps({"watch": "trains", "params": {}}))
            resync = await viewer.receive_from(timeout=5)
            assert 'id="trains-list"' in resync
            assert f'id="train-{train.pk}"' in resync

            def pause_and_look_before_committing() -> None:
                with transaction.atomic():
                    train_pause(train_id=train.pk, reason="vendor advisory", actor=operator)
                    assert async_to_sync(viewer.receive_nothing)(timeout=0.5)  # not announced before the commit

            await sync_to_async(pause_and_look_before_committing)()
            html = await viewer.receive_from(timeout=5)
            assert f'<div id="train-{train.pk}" class="train-status" data-state="paused" hx-swap-oob="true">' in html
            assert "vendor advisory" in html
            assert "pause-form" not in html

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_an_operator_on_the_upgrades_page_sees_another_operators_reonboard_request_waiting_live() -> None:
    upgrade = offboarded_upgrade()
    cookie = session_cookie(make_user(Role.OPERATOR))
    requester = make_user(Role.OPERATOR)

    def request_reonboarding() -> None:
        upgrade_reonboard_request(upgrade_id=upgrade.pk, reason="vendor fixed it", actor=requester)

    async def scenario() -> None:
        async with connected(cookie) as operator:
            await operator.send_to(text_data=json.dumps({"watch": "trains", "params": UPGRADES}))
            assert 'data-reonboard="none"' in await operator.receive_from(timeout=5)
            await sync_to_async(request_reonboarding)()
            html = await operator.receive_from(timeout=5)
            assert f'id="upgrade-{upgrade.pk}"' in html
            assert 'data-reonboard="pending"' in html
            assert f"Re-onboarding requested by {requester.username}, waiting for approval" in html

    run(scenario)
