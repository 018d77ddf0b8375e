"""A burst of announcements on the live websocket.

Each commit that writes events announces its pool; many executors reporting at once make many
commits of one pool within a second. The channel layer keeps at most `capacity` messages per
channel and drops the rest silently, so a socket that renders one fragment per message falls
behind, its channel fills, and the announcement of another pool (or of the approvals) that
arrives then is lost: that row stays stale until the page reconnects.
"""

from __future__ import annotations

import time

import pytest
from asgiref.sync import sync_to_async
from django.db import transaction

from fleet.models import HostState
from fleet.services import host_transition
from opsplanner.live import announce_after_commit, pool_group
from opsplanner.roles import Role
from tests.builders import make_fleet
from tests.test_live import connected, run, session_cookie
from tests.trains_builders import make_user

pytestmark = pytest.mark.django_db(transaction=True)
BURST = 300  # well over the channel layer's capacity (100 messages per channel)


def test_after_a_burst_of_one_pools_announcements_another_pools_change_still_reaches_the_viewer() -> None:
    busy, _ = make_fleet(domains=1, hosts_per_domain=2, pool_name="busy-east")
    _, quiet_hosts = make_fleet(domains=1, hosts_per_domain=2, pool_name="quiet-west")
    cookie = session_cookie(make_user(Role.VIEWER))

    def burst_then_change_the_quiet_pool() -> None:
        for _ in range(BURST):
            with transaction.atomic():  # one commit each, as many executors' reports are
                announce_after_commit({pool_group(busy.pk)})
        host_transition(host_id=quiet_hosts[0].pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="x")

    async def scenario() -> None:
        async with connected(cookie) as viewer:
            await sync_to_async(burst_then_change_the_quiet_pool)()
            pushes = 0
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    html = await viewer.receive_from(timeout=3)
                except TimeoutError:
                    break
                pushes += 1
                if 'id="pool-quiet-west"' in html:
                    assert '<td class="num in-service">1</td>' in html
                    break
            else:
                html = ""
            assert 'id="pool-quiet-west"' in html, f"the quiet pool's change was lost after {pushes} pushes"
            # Coalesced: the burst is not replayed one render per announcement.
            assert pushes < BURST / 3

    run(scenario)
